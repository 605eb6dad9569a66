// Command worker-pool is an active/passive worker pool: three replicas
// stand by, and only the leader (the active one) runs its workers, which
// drain a jobs table together. Workers claim jobs with FOR UPDATE SKIP
// LOCKED, so they never wait for each other, and do each job's work in the
// claiming transaction, fenced with the leader's term: a job is done once,
// or not at all and claimed again by the next active replica.
//
//	go run ./examples/worker-pool
//
// It enqueues 600 jobs, hands over on request a third of the way, ends the
// active replica's lock session two thirds of the way (as a crash would),
// and checks that every job was done exactly once.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/leader"
	"github.com/pgleader/pgleader/pgleadertest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM) // a pod gets SIGTERM
	defer stop()
	if err := demo(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "worker-pool:", err)
		os.Exit(1)
	}
}

const schema = `
CREATE TABLE IF NOT EXISTS jobs (
    id      bigserial PRIMARY KEY,
    payload text NOT NULL,
    done_by text,
    done_at timestamptz
);
-- The work's effect: one row per time a job's work committed. Nothing
-- makes it unique, so that a job done twice would show.
CREATE TABLE IF NOT EXISTS job_effects (
    job_id bigint NOT NULL,
    worker text   NOT NULL,
    term   bigint NOT NULL
)`

// key is the election of the active replica.
var key = leader.KeyFromName("examples/worker-pool/active")

// replica is one process of the pool.
type replica struct {
	dsn      string
	identity string
	workers  int
	perJob   time.Duration // how long a job's work takes
	report   func(ev string, l leader.Leadership, detail string)
	config   func(*elector.Config)
}

// run stands by, and runs the workers while this replica leads.
func (r *replica) run(ctx context.Context) error {
	pcfg, err := pgxpool.ParseConfig(r.dsn)
	if err != nil {
		return err
	}
	// A paused worker's open transaction would block the next term (see
	// leader.Fence): the server ends it.
	pcfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = "3s"
	pcfg.MaxConns = int32(r.workers + 1)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg := elector.Config{
		Connect:  elector.DSN(r.dsn),
		Key:      key,
		Identity: r.identity,
		Fencing:  elector.Fencing{Enabled: true},
		Callbacks: elector.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) {
			r.report("active", l, "")
			var wg sync.WaitGroup
			for w := 1; w <= r.workers; w++ {
				wg.Add(1)
				go func() { defer wg.Done(); r.work(ctx, pool, l, fmt.Sprintf("%s/%d", r.identity, w)) }()
			}
			wg.Wait()
			r.report("passive", l, "")
		}},
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

// work claims one job at a time with SKIP LOCKED and does it in the same
// transaction, fenced: the job is marked done and its effect written, or,
// if the transaction fails (demoted, crashed, fenced), neither, and the job
// is free again.
func (r *replica) work(ctx context.Context, pool *pgxpool.Pool, l leader.Leadership, worker string) {
	for ctx.Err() == nil {
		got := false
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := l.Fence(ctx, tx); err != nil {
				return err
			}
			var id int64
			err := tx.QueryRow(ctx, `SELECT id FROM jobs WHERE done_at IS NULL ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED`).Scan(&id)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			if err != nil {
				return err
			}
			got = true
			time.Sleep(r.perJob) // the job's work
			if _, err := tx.Exec(ctx, `INSERT INTO job_effects (job_id, worker, term) VALUES ($1, $2, $3)`, id, worker, l.Term); err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `UPDATE jobs SET done_by = $1, done_at = now() WHERE id = $2`, worker, id)
			return err
		})
		if errors.Is(err, leader.ErrFenced) {
			r.report("fenced", l, worker)
			return
		}
		if err == nil && got {
			continue
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func demo(ctx context.Context) error {
	const jobs = 600
	dsn, release, err := pgleadertest.Database()
	if err != nil {
		return err
	}
	defer release()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	conn.Exec(ctx, `DROP TABLE IF EXISTS jobs, job_effects`)
	if _, err := conn.Exec(ctx, schema); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, `INSERT INTO jobs (payload) SELECT 'job ' || i FROM generate_series(1, $1) i`, jobs); err != nil {
		return err
	}
	fmt.Printf("%d jobs enqueued; 3 replicas of 4 workers each, one active\n", jobs)
	rctx, stopReplicas := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var mu sync.Mutex
	active := ""
	for i := 1; i <= 3; i++ {
		r := &replica{dsn: dsn, identity: fmt.Sprintf("replica-%d", i), workers: 4, perJob: 10 * time.Millisecond,
			report: func(ev string, l leader.Leadership, detail string) {
				mu.Lock()
				defer mu.Unlock()
				if ev == "active" {
					active = l.Identity
				}
				fmt.Printf("  %s (term %d): %s %s\n", l.Identity, l.Term, ev, detail)
			}}
		wg.Add(1)
		go func() { defer wg.Done(); r.run(rctx) }()
	}
	defer func() { stopReplicas(); wg.Wait() }()
	done := func() (n int64) {
		conn.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE done_at IS NOT NULL`).Scan(&n)
		return n
	}
	waitDone := func(n int64) error {
		for done() < n {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
		return nil
	}
	if err := waitDone(jobs / 3); err != nil {
		return err
	}
	ho, err := elector.RequestResign(ctx, elector.DSN(dsn), key, "")
	if err != nil {
		return err
	}
	fmt.Printf("handover on request: %s -> %s in %s (%d jobs done)\n", ho.From, ho.To, ho.Took.Round(time.Microsecond), done())
	if err := waitDone(2 * jobs / 3); err != nil {
		return err
	}
	mu.Lock()
	victim := active
	mu.Unlock()
	conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, victim)
	fmt.Printf("terminated the active replica %s's lock session (%d jobs done)\n", victim, done())
	if err := waitDone(jobs); err != nil {
		return err
	}
	stopReplicas()
	wg.Wait()
	return check(ctx, conn, jobs)
}

// check: every job is done, and its work committed exactly once.
func check(ctx context.Context, conn *pgx.Conn, jobs int) error {
	var done, effects, twice, missing int64
	if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM jobs WHERE done_at IS NOT NULL), (SELECT count(*) FROM job_effects),
  (SELECT count(*) FROM (SELECT job_id FROM job_effects GROUP BY job_id HAVING count(*) > 1) d),
  (SELECT count(*) FROM jobs j WHERE NOT EXISTS (SELECT FROM job_effects e WHERE e.job_id = j.id))`).Scan(&done, &effects, &twice, &missing); err != nil {
		return err
	}
	fmt.Printf("check: %d jobs, %d done, %d effects, %d done twice, %d never done: ", jobs, done, effects, twice, missing)
	if done != int64(jobs) || effects != int64(jobs) || twice != 0 || missing != 0 {
		fmt.Println("FAILED")
		return errors.New("a job was lost or done twice")
	}
	fmt.Println("OK")
	return nil
}
