package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/leader"
)

var shared testpg.Shared

func TestMain(m *testing.M) { os.Exit(testpg.Main(m, childMain, &shared)) }

const testLease = 2 * time.Second

// childMain is one replica process: an elector and a gocron scheduler
// whose every-second job records its tick in the database.
func childMain(role string) int {
	stdinClosed, stop := testpg.UntilStdinCloses()
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	conn, err := pgx.Connect(ctx, os.Getenv("SCHED_DSN"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	em := testpg.NewEmitter(os.Stdout)
	e, s, err := newReplica(os.Getenv("SCHED_DSN"), role, func(c *elector.Config) {
		c.RenewInterval, c.RenewDeadline, c.LeaseDuration = 200*time.Millisecond, time.Second, testLease
	}, func(ctx context.Context, e *elector.Elector, l leader.Leadership) {
		em.Emit(testpg.Event{Ev: "elected", Identity: l.Identity})
	}, func() {
		// The tick this run belongs to (a run starts up to 0.9 s late).
		tick := time.Now().Add(100 * time.Millisecond).Truncate(time.Second).Unix()
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
		defer wcancel()
		if _, err := conn.Exec(wctx, `INSERT INTO ticks (tick, replica) VALUES ($1, $2)`, tick, role); err != nil {
			fmt.Fprintln(os.Stderr, "record tick:", err)
		}
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	done := make(chan struct{})
	go func() { defer close(done); e.Run(ctx) }()
	s.Start()
	<-stdinClosed.Done()
	s.Shutdown()
	cancel()
	<-done
	return 0
}

// Three replica processes, a job every second: through a resign, a
// SIGKILL and a SIGSTOP past the lease, no tick runs twice, and every tick
// runs except those inside a failover window (from the fault to a second
// after the next election).
func TestEachTickOnceThroughFaults(t *testing.T) {
	srv := shared.Get(t)
	ctx := context.Background()
	conn, err := srv.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `DROP TABLE IF EXISTS ticks; CREATE TABLE ticks (tick bigint NOT NULL, replica text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	key := leader.KeyFromName("examples/scheduler")
	children := map[string]*testpg.Child{}
	n := 0
	spawn := func() {
		n++
		id := fmt.Sprintf("replica-%d", n)
		children[id] = testpg.StartChild(t, id, "SCHED_DSN="+srv.DSN())
	}
	for range 3 {
		spawn()
	}
	holder := func() string {
		t.Helper()
		h, err := leader.Holder(ctx, conn, key)
		if err != nil {
			t.Fatal(err)
		}
		return h.Holder.Identity
	}
	// elected waits for the next election after since, by anyone but not.
	elected := func(not string, since int64) time.Time {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			for id, c := range children {
				for _, e := range c.Log() {
					if id != not && e.Ev == "elected" && e.Mono >= since {
						return time.Now()
					}
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("no election after the fault on %s", not)
		return time.Time{}
	}
	type window struct{ from, to time.Time }
	var gaps []window
	for holder() == "" {
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	time.Sleep(3 * time.Second)

	cur := holder()
	from, since := time.Now(), testpg.Mono()
	if _, err := elector.RequestResign(ctx, elector.DSN(srv.DSN()), key, ""); err != nil {
		t.Fatal(err)
	}
	gaps = append(gaps, window{from, elected(cur, since).Add(time.Second)})
	time.Sleep(3 * time.Second)

	cur = holder()
	from, since = time.Now(), testpg.Mono()
	children[cur].Signal(syscall.SIGKILL)
	gaps = append(gaps, window{from, elected(cur, since).Add(time.Second)})
	delete(children, cur)
	spawn()
	time.Sleep(3 * time.Second)

	cur = holder()
	from, since = time.Now(), testpg.Mono()
	children[cur].Pause()
	gaps = append(gaps, window{from, elected(cur, since).Add(time.Second)})
	time.Sleep(testLease)
	children[cur].Resume()
	time.Sleep(3 * time.Second)
	end := time.Now()
	for _, c := range children {
		c.CloseStdin()
	}
	for id, c := range children {
		select {
		case <-c.Done():
		case <-time.After(time.Minute):
			t.Fatalf("%s did not stop within a minute of its stdin's end", id)
		}
	}

	rows, err := conn.Query(ctx, `SELECT tick, array_agg(replica ORDER BY replica) FROM ticks GROUP BY tick ORDER BY tick`)
	if err != nil {
		t.Fatal(err)
	}
	ran := map[int64][]string{}
	for rows.Next() {
		var tick int64
		var who []string
		if err := rows.Scan(&tick, &who); err != nil {
			t.Fatal(err)
		}
		ran[tick] = who
		if len(who) > 1 {
			t.Errorf("tick %s ran %d times: %v", time.Unix(tick, 0).Format(time.TimeOnly), len(who), who)
		}
	}
	rows.Close()
	var missed, skipped []string
	for tick := start.Add(time.Second).Truncate(time.Second); tick.Before(end.Add(-time.Second)); tick = tick.Add(time.Second) {
		if _, ok := ran[tick.Unix()]; ok {
			continue
		}
		inGap := false
		for _, g := range gaps {
			inGap = inGap || (!tick.Before(g.from.Truncate(time.Second)) && !tick.After(g.to))
		}
		if inGap {
			skipped = append(skipped, tick.Format(time.TimeOnly))
		} else {
			missed = append(missed, tick.Format(time.TimeOnly))
		}
	}
	t.Logf("ticks skipped inside a failover window: %v", skipped)
	if len(missed) > 0 {
		t.Fatalf("ticks missed outside the failover windows: %v", missed)
	}
	var ticks []int64
	for tick := range ran {
		ticks = append(ticks, tick)
	}
	sort.Slice(ticks, func(i, j int) bool { return ticks[i] < ticks[j] })
	var ws []string
	for _, g := range gaps {
		ws = append(ws, fmt.Sprintf("%s+%s", g.from.Format("15:04:05.000"), g.to.Sub(g.from).Round(time.Millisecond)))
	}
	t.Logf("%d ticks ran, each once; failover windows (fault + how long, one second of slack included): %v", len(ticks), ws)
}
