// Command worker-pool runs three workers that drain a jobs table together,
// and one singleton part that only the leader runs: the producer that
// enqueues work. Workers claim jobs with FOR UPDATE SKIP LOCKED (every
// worker is active for claiming); the producer's inserts are fenced with
// the leader's term, so a deposed producer cannot enqueue.
//
//	go run ./examples/worker-pool
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/internal/exampledb"
	"github.com/pgleader/pgleader/leader"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "worker-pool:", err)
		os.Exit(1)
	}
}

const schema = `CREATE TABLE IF NOT EXISTS jobs (
  id bigserial PRIMARY KEY, payload text NOT NULL, term bigint NOT NULL,
  done_by text, done_at timestamptz)`

func run() error {
	dsn, release, err := exampledb.DSN()
	if err != nil {
		return err
	}
	defer release()
	sigCtx, stopSignals := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM) // a pod gets SIGTERM
	defer stopSignals()
	ctx, cancel := context.WithTimeout(sigCtx, 6*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, schema); err != nil {
		return err
	}
	var wg sync.WaitGroup
	var processed atomic.Int64
	counts := make([]atomic.Int64, 3)
	for i := 0; i < 3; i++ {
		id := fmt.Sprintf("worker-%d", i+1)
		e, err := elector.New(elector.Config{
			Connect:  elector.DSN(dsn),
			Key:      leader.KeyFromName("examples/worker-pool/producer"),
			Identity: id,
			Fencing:  elector.Fencing{Enabled: true},
			Callbacks: elector.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) {
				fmt.Printf("%s leads (term %d): producing jobs\n", l.Identity, l.Term)
				produce(ctx, pool, l)
			}},
		})
		if err != nil {
			return err
		}
		wg.Add(2)
		go func() { defer wg.Done(); e.Run(ctx) }()
		go func() { defer wg.Done(); work(ctx, pool, id, &counts[i], &processed) }()
	}
	wg.Wait()
	fmt.Printf("processed %d jobs: ", processed.Load())
	for i := range counts {
		fmt.Printf("worker-%d %d  ", i+1, counts[i].Load())
	}
	fmt.Println()
	return nil
}

// produce enqueues a job every 20ms while leading, fenced by the term.
func produce(ctx context.Context, pool *pgxpool.Pool, l leader.Leadership) {
	for n := 0; ctx.Err() == nil; n++ {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := l.Fence(ctx, tx); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO jobs (payload, term) VALUES ($1, $2)`, fmt.Sprintf("job %d", n), l.Term)
			return err
		})
		if errors.Is(err, leader.ErrFenced) {
			fmt.Println("producer fenced: a newer leader exists")
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// work claims one job at a time with SKIP LOCKED, so workers never wait
// for each other.
func work(ctx context.Context, pool *pgxpool.Pool, id string, mine, all *atomic.Int64) {
	for ctx.Err() == nil {
		var got bool
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var jobID int64
			err := tx.QueryRow(ctx, `SELECT id FROM jobs WHERE done_at IS NULL ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED`).Scan(&jobID)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			if err != nil {
				return err
			}
			got = true
			_, err = tx.Exec(ctx, `UPDATE jobs SET done_by = $1, done_at = now() WHERE id = $2`, id, jobID)
			return err
		})
		if err == nil && got {
			mine.Add(1)
			all.Add(1)
			continue
		}
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Millisecond):
		}
	}
}
