// Command kafka-singleton keeps exactly one Kafka consumer of a topic alive
// across a fleet, and applies every record's effect in PostgreSQL exactly
// once, across handovers, crashes and pauses (see README.md here).
//
// With no KAFKA_BROKERS it runs a demo on its own: an in-process Kafka
// cluster (franz-go's kfake, which speaks the real protocol), a throwaway
// PostgreSQL (or DATABASE_URL), a stream of records, and three replicas of
// the consumer; it hands over on request, kills the leader's session,
// hands over to a named replica, and checks that every record's effect
// exists exactly once:
//
//	go run ./examples/kafka-singleton
//
// With KAFKA_BROKERS it runs one replica against a real cluster; run it
// on every host:
//
//	KAFKA_BROKERS=kafka:9092 KAFKA_TOPIC=events DATABASE_URL=postgres://... go run ./examples/kafka-singleton
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/leader"
	"github.com/pgleader/pgleader/pgleadertest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if brokers := os.Getenv("KAFKA_BROKERS"); brokers != "" {
		err = runReplica(ctx, strings.Split(brokers, ","), envOr("KAFKA_TOPIC", "events"))
	} else {
		err = demo(ctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kafka-singleton:", err)
		os.Exit(1)
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// runReplica is one replica against a real cluster.
func runReplica(ctx context.Context, brokers []string, topic string) error {
	dsn, release, err := pgleadertest.Database()
	if err != nil {
		return err
	}
	defer release()
	r := &replica{dsn: dsn, brokers: brokers, topic: topic, identity: leader.DefaultIdentity(),
		report: func(ev string, l leader.Leadership, detail string) {
			fmt.Printf("%s term %d: %s %s\n", l.Identity, l.Term, ev, detail)
		}}
	err = r.run(ctx)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// demo runs the whole story in one process.
func demo(ctx context.Context) error {
	const topic, partitions, records = "events", 3, 3000
	dsn, release, err := pgleadertest.Database()
	if err != nil {
		return err
	}
	defer release()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic))
	if err != nil {
		return err
	}
	defer kc.Close()
	brokers := kc.ListenAddrs()
	if err := produce(ctx, brokers, topic, records); err != nil {
		return err
	}
	fmt.Printf("in-process Kafka (kfake) at %s: topic %q, %d partitions, %d records\n", brokers[0], topic, partitions, records)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	// A fresh start for the demo's tables, when DATABASE_URL is reused.
	conn.Exec(ctx, `DROP TABLE IF EXISTS kafka_effects, kafka_offsets`)
	if _, err := conn.Exec(ctx, schema); err != nil {
		return err
	}

	rctx, stopReplicas := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var mu sync.Mutex
	leaderNow := ""
	for i := 1; i <= 3; i++ {
		r := &replica{dsn: dsn, brokers: brokers, topic: topic, identity: fmt.Sprintf("replica-%d", i), perRecord: time.Millisecond,
			report: func(ev string, l leader.Leadership, detail string) {
				mu.Lock()
				defer mu.Unlock()
				if ev == "consuming" {
					leaderNow = l.Identity
				}
				fmt.Printf("  %-9s term %d: %s %s\n", l.Identity, l.Term, ev, detail)
			}}
		wg.Add(1)
		go func() { defer wg.Done(); r.run(rctx) }()
	}
	defer func() { stopReplicas(); wg.Wait() }()

	key := leader.KeyFromName("kafka-singleton/" + topic)
	progress := func() (n int64) {
		conn.QueryRow(ctx, `SELECT count(*) FROM kafka_effects`).Scan(&n)
		return n
	}
	waitFor := func(n int64) error {
		for progress() < n {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
		return nil
	}
	// A quarter in: a handover on request, as `pgleader resign` does it.
	if err := waitFor(records / 4); err != nil {
		return err
	}
	ho, err := elector.RequestResign(ctx, elector.DSN(dsn), key, "")
	if err != nil {
		return err
	}
	fmt.Printf("handover on request: %s -> %s in %s (%d records applied)\n", ho.From, ho.To, ho.Took.Round(time.Microsecond), progress())
	// Half way: the leader's session dies (as in a crash or a partition).
	if err := waitFor(records / 2); err != nil {
		return err
	}
	mu.Lock()
	victim := leaderNow
	mu.Unlock()
	conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, victim)
	fmt.Printf("terminated the leader %s's lock session (%d records applied)\n", victim, progress())
	// Three quarters: a handover to a named replica.
	if err := waitFor(records * 3 / 4); err != nil {
		return err
	}
	mu.Lock()
	cur := leaderNow
	mu.Unlock()
	to := "replica-1"
	if cur == to {
		to = "replica-2"
	}
	ho, err = elector.RequestResign(ctx, elector.DSN(dsn), key, to)
	if err != nil {
		return err
	}
	fmt.Printf("handover on request to %s: %s -> %s in %s (%d records applied)\n", to, ho.From, ho.To, ho.Took.Round(time.Microsecond), progress())
	if err := waitFor(records); err != nil {
		return err
	}
	stopReplicas()
	wg.Wait()
	return check(ctx, conn, topic, partitions, records)
}

// produce writes n records, spread over the topic's partitions.
func produce(ctx context.Context, brokers []string, topic string, n int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		return err
	}
	defer cl.Close()
	var recs []*kgo.Record
	for i := 0; i < n; i++ {
		recs = append(recs, &kgo.Record{Key: []byte(fmt.Sprint(i % 7)), Value: []byte(fmt.Sprintf("record-%d", i))})
	}
	return cl.ProduceSync(ctx, recs...).FirstErr()
}

// check verifies exactly-once: every produced record has exactly one
// effect, the stored offsets are the partitions' ends, every partition's
// effects are contiguous from 0, and no write with an older term was
// accepted after a newer one.
func check(ctx context.Context, conn *pgx.Conn, topic string, partitions, records int) error {
	var effects, distinct, values, stale int64
	var terms []int64
	if err := conn.QueryRow(ctx, `SELECT count(*), count(DISTINCT (partition, kafka_offset)), count(DISTINCT value),
  array_agg(DISTINCT term ORDER BY term) FROM kafka_effects WHERE topic = $1`, topic).Scan(&effects, &distinct, &values, &terms); err != nil {
		return err
	}
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM (SELECT term, max(term) OVER (ORDER BY seq ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) before
  FROM kafka_effects WHERE topic = $1) s WHERE term < before`, topic).Scan(&stale); err != nil {
		return err
	}
	var gaps int64
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM (SELECT partition, count(*) n, max(kafka_offset) mx FROM kafka_effects WHERE topic = $1 GROUP BY partition) p
  JOIN kafka_offsets o ON o.topic = $1 AND o.partition = p.partition WHERE p.n <> p.mx + 1 OR o.next_offset <> p.mx + 1`, topic).Scan(&gaps); err != nil {
		return err
	}
	ok := effects == int64(records) && distinct == effects && values == effects && stale == 0 && gaps == 0
	fmt.Printf("exactly-once check: %d records produced, %d effects, %d distinct records; terms %v; stale writes accepted: %d; partitions with gaps or wrong stored offsets: %d: ",
		records, effects, values, terms, stale, gaps)
	if !ok {
		fmt.Println("FAILED")
		return errors.New("exactly-once check failed")
	}
	fmt.Println("OK")
	return nil
}
