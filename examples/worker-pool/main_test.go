package main

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/leader"
)

var shared testpg.Shared

func TestMain(m *testing.M) { os.Exit(testpg.Main(m, childMain, &shared)) }

const (
	testLease = 2 * time.Second
	// takeoverBound: after a kill the server sees the connection close at
	// once; after a pause, LeaseDuration plus the open transaction's
	// idle_in_transaction_session_timeout (3 s). Room for a shared machine.
	takeoverBound = testLease + 3*time.Second + 10*time.Second
)

// childMain is one replica process of the pool.
func childMain(role string) int {
	em := testpg.NewEmitter(os.Stdout)
	r := &replica{dsn: os.Getenv("WP_DSN"), identity: role, workers: 4, perJob: 2 * time.Millisecond,
		report: func(ev string, l leader.Leadership, detail string) {
			em.Emit(testpg.Event{Ev: ev, Identity: l.Identity, Term: l.Term, Data: detail})
		},
		config: func(c *elector.Config) {
			c.RenewInterval, c.RenewDeadline, c.LeaseDuration = 200*time.Millisecond, time.Second, testLease
		}}
	ctx, cancel := testpg.UntilStdinCloses()
	defer cancel()
	if err := r.run(ctx); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// Three replica processes; only the active one works. Its process is
// SIGKILLed mid-stream, then the next active one is SIGSTOPped past the
// lease: the passive side takes over within the bound each time, and
// every job is done exactly once (none lost with the killed or paused
// worker's open transaction, none done twice).
func TestActivePassiveUnderFaults(t *testing.T) {
	const jobs = 3000
	srv := shared.Get(t)
	ctx := context.Background()
	conn, err := srv.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `DROP TABLE IF EXISTS jobs, job_effects; `+schema); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO jobs (payload) SELECT 'job ' || i FROM generate_series(1, $1) i`, jobs); err != nil {
		t.Fatal(err)
	}
	children := map[string]*testpg.Child{}
	for i := 1; i <= 3; i++ {
		id := fmt.Sprintf("replica-%d", i)
		children[id] = testpg.StartChild(t, id, "WP_DSN="+srv.DSN())
	}
	done := func() (n int64) {
		conn.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE done_at IS NOT NULL`).Scan(&n)
		return n
	}
	waitDone := func(n int64) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for done() < n {
			if time.Now().After(deadline) {
				t.Fatalf("only %d of %d jobs done", done(), n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	active := func() string {
		t.Helper()
		h, err := leader.Holder(ctx, conn, key)
		if err != nil {
			t.Fatal(err)
		}
		return h.Holder.Identity
	}
	// takeover waits until a replica other than not turns active, and
	// returns how long that took.
	takeover := func(not string, began time.Time, since int64) time.Duration {
		t.Helper()
		for {
			for id, c := range children {
				if id == not {
					continue
				}
				for _, e := range c.Log() {
					if e.Ev == "active" && e.Mono >= since {
						return time.Since(began)
					}
				}
			}
			if time.Since(began) > takeoverBound {
				t.Fatalf("no passive replica took over from %s within %s", not, takeoverBound)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	waitDone(jobs / 3)
	victim := active()
	began, since := time.Now(), testpg.Mono()
	children[victim].Signal(syscall.SIGKILL)
	took := takeover(victim, began, since)
	t.Logf("SIGKILL of the active %s: %s took over after %s", victim, active(), took)

	waitDone(2 * jobs / 3)
	paused := active()
	began, since = time.Now(), testpg.Mono()
	children[paused].Pause()
	took = takeover(paused, began, since)
	time.Sleep(testLease + 3*time.Second)
	resumed := testpg.Mono()
	children[paused].Resume()
	t.Logf("SIGSTOP of the active %s past the lease: %s took over after %s", paused, active(), took)

	waitDone(jobs)
	// The resumed replica finds out it was demoted and stops its workers.
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	if _, err := children[paused].WaitAfter(wctx, "passive", resumed); err != nil {
		t.Fatal(err)
	}
	if err := check(ctx, conn, jobs); err != nil {
		t.Fatal(err)
	}
	var byTerm []string
	rows, _ := conn.Query(ctx, `SELECT term || ': ' || count(*) FROM job_effects GROUP BY term ORDER BY term`)
	for rows.Next() {
		var s string
		rows.Scan(&s)
		byTerm = append(byTerm, s)
	}
	rows.Close()
	t.Logf("jobs done per term: %v", byTerm)
}
