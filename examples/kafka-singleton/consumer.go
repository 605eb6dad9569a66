package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/leader"
)

// schema holds each record's effect and, per partition, the next offset to
// consume. Both are written in one transaction per batch, fenced by the
// leader's term.
const schema = `
CREATE TABLE IF NOT EXISTS kafka_effects (
    topic        text   NOT NULL,
    partition    int    NOT NULL,
    kafka_offset bigint NOT NULL,
    value        text   NOT NULL,
    term         bigint NOT NULL,       -- the leader's term that applied it
    seq          bigserial,             -- commit order, for the checks
    PRIMARY KEY (topic, partition, kafka_offset)
);
CREATE TABLE IF NOT EXISTS kafka_offsets (
    topic       text   NOT NULL,
    partition   int    NOT NULL,
    next_offset bigint NOT NULL,
    term        bigint NOT NULL,
    PRIMARY KEY (topic, partition)
)`

// consumerGroup is the Kafka group the offsets are also committed to on
// demotion, for lag tooling; PostgreSQL's offsets are the ones that count.
const consumerGroup = "pgleader-singleton"

// batchSize is the most records one transaction applies.
const batchSize = 100

// replica is one consumer process's configuration.
type replica struct {
	dsn      string
	brokers  []string
	topic    string
	identity string
	// perRecord is how long processing a record takes (the demo and the
	// test make it slow, so that faults land mid-stream).
	perRecord time.Duration
	// report hears the replica's events: "consuming" when a term starts
	// consuming, "stopped" when it stopped, "fenced" when a write was
	// refused because a newer term exists.
	report func(ev string, l leader.Leadership, detail string)
	// config lets a test tighten the elector's timings.
	config func(*elector.Config)
}

// run campaigns until ctx ends. Each term consumes with a client of its
// own (as franz-go's author advises: a new client per leadership term),
// from the offsets stored in PostgreSQL.
func (r *replica) run(ctx context.Context) error {
	pcfg, err := pgxpool.ParseConfig(r.dsn)
	if err != nil {
		return err
	}
	// A transaction of a paused leader holds its share lock on the term
	// row and would block the next leader's term (see leader.Fence): the
	// server ends such a session after a while.
	pcfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = "3s"
	pcfg.ConnConfig.RuntimeParams["application_name"] = r.identity + "/work"
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, schema); err != nil {
		return err
	}
	cfg := elector.Config{
		Connect:  elector.DSN(r.dsn),
		Key:      leader.KeyFromName("kafka-singleton/" + r.topic),
		Identity: r.identity,
		Fencing:  elector.Fencing{Enabled: true},
		Callbacks: elector.Callbacks{
			OnElected: func(ctx context.Context, l leader.Leadership) {
				if err := r.consume(ctx, pool, l); err != nil && ctx.Err() == nil {
					r.report("error", l, err.Error())
				}
			},
		},
		// Leave time to finish a batch and commit before the lock goes.
		ReleaseTimeout: 15 * time.Second,
	}
	if r.config != nil {
		r.config(&cfg)
	}
	e, err := elector.New(cfg)
	if err != nil {
		return err
	}
	return e.Run(ctx)
}

// consume is one leadership term: it reads PostgreSQL's offsets, consumes
// every partition from there, and applies each batch in one fenced
// transaction. It returns when ctx ends (demoted) or a write is fenced.
func (r *replica) consume(ctx context.Context, pool *pgxpool.Pool, l leader.Leadership) error {
	admCl, err := kgo.NewClient(kgo.SeedBrokers(r.brokers...))
	if err != nil {
		return err
	}
	adm := kadm.NewClient(admCl)
	defer adm.Close()
	topics, err := adm.ListTopics(ctx, r.topic)
	if err != nil {
		return err
	}
	td, ok := topics[r.topic]
	if !ok || td.Err != nil {
		return fmt.Errorf("topic %s: %v", r.topic, td.Err)
	}
	start := map[int32]kgo.Offset{}
	for _, p := range td.Partitions.Numbers() {
		start[p] = kgo.NewOffset().AtStart()
	}
	rows, err := pool.Query(ctx, `SELECT partition, next_offset FROM kafka_offsets WHERE topic = $1`, r.topic)
	if err != nil {
		return err
	}
	stored, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
		P    int32
		Next int64
	}])
	if err != nil {
		return err
	}
	for _, s := range stored {
		start[s.P] = kgo.NewOffset().At(s.Next)
	}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(r.brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{r.topic: start}),
		kgo.FetchMaxWait(250*time.Millisecond),
	)
	if err != nil {
		return err
	}
	defer cl.Close()
	r.report("consuming", l, fmt.Sprint(len(start), " partitions"))
	defer r.report("stopped", l, "")
	for ctx.Err() == nil {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			break
		}
		var fenced error
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if fenced != nil || len(p.Records) == 0 || ctx.Err() != nil {
				return
			}
			// At most batchSize records a transaction: a short transaction
			// keeps a handover short (the old leader finishes it first).
			for recs := p.Records; len(recs) > 0 && fenced == nil && ctx.Err() == nil; {
				n := min(len(recs), batchSize)
				fenced = r.apply(ctx, pool, l, p.Partition, recs[:n])
				recs = recs[n:]
			}
		})
		if errors.Is(fenced, leader.ErrFenced) {
			r.report("fenced", l, fenced.Error())
			return nil
		}
		if fenced != nil && ctx.Err() == nil {
			return fenced
		}
	}
	// Demoted or stopping: the processed offsets are in PostgreSQL
	// already; also commit them to the group, for lag tooling.
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return r.commitToGroup(cctx, pool, adm)
}

// apply applies one partition's batch: every record's effect and the next
// offset, in one transaction that Fence checks against newer terms. The
// offset update only continues from where the last batch ended; anything
// else is a bug and fails loudly.
func (r *replica) apply(ctx context.Context, pool *pgxpool.Pool, l leader.Leadership, partition int32, recs []*kgo.Record) error {
	first, last := recs[0].Offset, recs[len(recs)-1].Offset
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := l.Fence(ctx, tx); err != nil {
			return err
		}
		offsets := make([]int64, len(recs))
		values := make([]string, len(recs))
		for i, rec := range recs {
			// Demoted mid-batch: roll the batch back; the next leader
			// applies it from the stored offset.
			if err := ctx.Err(); err != nil {
				return err
			}
			// The record's processing: here it only takes time.
			time.Sleep(r.perRecord)
			offsets[i], values[i] = rec.Offset, string(rec.Value)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO kafka_effects (topic, partition, kafka_offset, value, term)
SELECT $1, $2, o, v, $3 FROM unnest($4::bigint[], $5::text[]) AS u(o, v)`, r.topic, partition, l.Term, offsets, values); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `INSERT INTO kafka_offsets AS k (topic, partition, next_offset, term) VALUES ($1, $2, $3, $4)
ON CONFLICT (topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset, term = EXCLUDED.term WHERE k.next_offset = $5`,
			r.topic, partition, last+1, l.Term, first)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("partition %d: the batch starts at %d, which is not where the stored offset stands", partition, first)
		}
		return nil
	})
}

// commitToGroup copies PostgreSQL's offsets to the Kafka group.
func (r *replica) commitToGroup(ctx context.Context, pool *pgxpool.Pool, adm *kadm.Client) error {
	rows, err := pool.Query(ctx, `SELECT partition, next_offset FROM kafka_offsets WHERE topic = $1`, r.topic)
	if err != nil {
		return err
	}
	var offs kadm.Offsets
	for rows.Next() {
		var p int32
		var next int64
		if err := rows.Scan(&p, &next); err != nil {
			return err
		}
		offs.Add(kadm.Offset{Topic: r.topic, Partition: p, At: next, LeaderEpoch: -1})
	}
	if err := rows.Err(); err != nil {
		return err
	}
	_, err = adm.CommitOffsets(ctx, consumerGroup, offs)
	return err
}
