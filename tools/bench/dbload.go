package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/leader"
)

// dbload measures what a standing fleet costs the database it shares: the
// server's CPU, from its own processes' accounting (/proc, so the server
// must run on this machine); the lines the fleet adds to the server log
// (the throwaway server's only); and pgbench -S throughput with and without
// the fleet, alternated in pairs so drift cancels, with a 3-elector fleet's
// ratio as the noise reference.
func (b *bencher) dbload(sizes []int, leaders, keyed int, window, settle time.Duration, pairs int) error {
	measure := func(scen, what string, n int, keys int) error {
		// Log lines count over the fleet's whole life too: its start (the
		// campaigns, the first election), its standing, and its stop (every
		// leader resigns, its heirs take over, every session ends).
		life0, _ := b.logLines()
		stop, err := b.standingFleet(n, keys)
		if err != nil {
			return err
		}
		time.Sleep(settle) // the first rounds done
		var locks int
		_ = b.admin.QueryRow(context.Background(), "SELECT count(*) FROM pg_catalog.pg_locks").Scan(&locks)
		// The window in three slices, and the median slice's CPU: a
		// checkpoint or an autovacuum run in one slice is the server's
		// own business, not the fleet's.
		var cpus []float64
		logs0, all0 := b.logLines()
		for i := 0; i < 3; i++ {
			cpu0, began := b.serverCPU(), time.Now()
			time.Sleep(window / 3)
			cpus = append(cpus, (b.serverCPU()-cpu0)/time.Since(began).Seconds())
		}
		cpu := median(cpus)
		logs, all := b.logLines()
		logs, all = logs-logs0, all-all0
		stop()
		life := b.lifeLines(life0, "dbload-")
		if cpu >= 0 && b.srv != nil {
			target := ""
			switch {
			case n == 200 && keys == 1:
				target = "<= 2"
			case keys == 100 && n == 300:
				target = "<= 3"
			}
			b.add(scen, "server CPU, "+what, "% core", target, []float64{100 * cpu})
			switch {
			case keys == 1:
				b.add(scen, "server CPU per follower", "us/s", "flat in n", []float64{1e6 * cpu / float64(n-1)})
			case n > keys:
				b.add(scen, "server CPU per key (a leader and its heirs)", "us/s", "", []float64{1e6 * cpu / float64(keys)})
			default:
				b.add(scen, "server CPU per renew", "ms", "", []float64{1000 * cpu / (float64(keys) / elector.DefaultRenewInterval.Seconds())})
			}
		}
		if b.srv != nil {
			b.add(scen, fmt.Sprintf("server log lines from the fleet in %s", window), "lines", "0", []float64{float64(logs)})
			b.add(scen, fmt.Sprintf("server log lines in all in %s (checkpoints too)", window), "lines", "", []float64{float64(all)})
			b.add(scen, "server log lines from the fleet, from its start to its stop", "lines", "0", []float64{float64(life)})
		}
		// The mean too: a fleet's rounds can come in waves (electors
		// started together keep their phase), which a median of slices
		// shorter than a wave's period would miss or count twice.
		mean := (cpus[0] + cpus[1] + cpus[2]) / 3
		fmt.Fprintf(b.out, "bench: %s (%s): server CPU %.2f%% of a core (median of %.2f, %.2f, %.2f; mean %.2f), %d log lines from the fleet (%d in all) in %s; %d from its start to its stop; %d locks in pg_locks\n",
			scen, what, 100*cpu, 100*cpus[0], 100*cpus[1], 100*cpus[2], 100*mean, logs, all, window, life, locks)
		return nil
	}
	for _, n := range sizes {
		if err := measure(fmt.Sprintf("dbload-%d", n), fmt.Sprintf("1 leader + %d followers", n-1), n, 1); err != nil {
			return err
		}
	}
	// The leader's side: leaders each on a key of its own, so the server's
	// cost is their renews.
	if n := leaders; n > 0 {
		if err := measure(fmt.Sprintf("dbload-leaders-%d", n), fmt.Sprintf("%d leaders on %d keys (renews only)", n, n), n, n); err != nil {
			return err
		}
	}
	// Separate Electors per key, three each (a leader and two heirs): the
	// fleet a Group replaces (docs/groups.md), and what heirs cost between
	// handovers.
	if k := keyed; k > 0 {
		if err := measure(fmt.Sprintf("dbload-keyed-%d", k), fmt.Sprintf("%d keys x 3 electors", k), 3*k, k); err != nil {
			return err
		}
	}
	pgbench := findPgbench(b)
	if pgbench == "" || pairs == 0 {
		fmt.Fprintln(b.out, "bench: dbload: no pgbench found; skipping the throughput pairs")
		return nil
	}
	if out, err := exec.Command(pgbench, "-i", "-s", "1", "-q", b.dsn).CombinedOutput(); err != nil {
		return fmt.Errorf("pgbench -i: %v\n%s", err, out)
	}
	for _, n := range []int{3, sizes[len(sizes)-1]} {
		var ratios []float64
		for i := 0; i < pairs; i++ {
			base, err := runPgbench(pgbench, b.dsn)
			if err != nil {
				return err
			}
			stop, err := b.standingFleet(n, 1)
			if err != nil {
				return err
			}
			time.Sleep(time.Second)
			with, err := runPgbench(pgbench, b.dsn)
			stop()
			if err != nil {
				return err
			}
			ratios = append(ratios, with/base)
			fmt.Fprintf(b.out, "bench: dbload pgbench -S with %d electors: %.0f vs %.0f tps alone (%.2f)\n", n, with, base, with/base)
		}
		b.add(fmt.Sprintf("dbload-%d", n), "pgbench -S tps with / without the fleet", "ratio", ">= 0.90 (200)", ratios)
	}
	return nil
}

// standingFleet starts n electors spread over `keys` keys in this process,
// with the default timings, waits until every one of them stands by (holds
// its key's roster lock), and returns what stops them.
func (b *bencher) standingFleet(n, keys int) (func(), error) {
	name := b.name("dbload")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, n)
	for i := 0; i < n; i++ {
		e, err := elector.New(elector.Config{
			Connect: elector.DSN(b.dsn), Key: leader.KeyFromName(fmt.Sprintf("%s-%d", name, i%keys)), Identity: fmt.Sprintf("dbload-%d", i),
			Callbacks: elector.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) { <-ctx.Done() }},
		})
		if err != nil {
			cancel()
			return nil, err
		}
		go func() { e.Run(ctx); done <- struct{}{} }()
	}
	stop := func() {
		cancel()
		for i := 0; i < n; i++ {
			<-done
		}
	}
	for k := 0; k < keys; k++ {
		if err := waitStanding(ctx, b.admin, leader.KeyFromName(fmt.Sprintf("%s-%d", name, k)), n/keys); err != nil {
			stop()
			return nil, err
		}
	}
	return stop, nil
}

// lifeLines is how many server log lines sessions named prefix… added
// since from (a count LogLinesOf gave), once the server has had a moment
// to write what a fleet's last sessions said as they ended.
func (b *bencher) lifeLines(from int, prefix string) int {
	if b.srv == nil {
		return -1
	}
	time.Sleep(time.Second)
	n := b.srv.LogLinesOf(prefix) - from
	if n > 0 {
		// What they were, for the reader (the log's last lines, which
		// may include a few of the server's own).
		fmt.Fprintf(b.out, "bench: the server log's last lines:\n%s\n", b.srv.LogTail(min(n+5, 40)))
	}
	return n
}

func (b *bencher) logLines() (fleet, all int) {
	if b.srv == nil {
		return -1, -1
	}
	return b.srv.LogLinesOf("dbload-"), b.srv.LogLines()
}

// runPgbench runs 10 s of pgbench -S with 4 clients and returns its tps.
func runPgbench(pgbench, dsn string) (float64, error) {
	out, err := exec.Command(pgbench, "-S", "-c", "4", "-j", "2", "-T", "10", "-n", dsn).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("pgbench -S: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "tps = ") {
			f := strings.Fields(line)
			return strconv.ParseFloat(f[2], 64)
		}
	}
	return 0, fmt.Errorf("no tps in pgbench's output:\n%s", out)
}

func findPgbench(b *bencher) string {
	if b.srv != nil {
		if p := filepath.Join(b.srv.BinDir(), "pgbench"); fileExists(p) {
			return p
		}
	}
	if p, err := exec.LookPath("pgbench"); err == nil {
		return p
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pgbench")
	sort.Strings(dirs)
	if len(dirs) > 0 {
		return dirs[len(dirs)-1]
	}
	return ""
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// freshness measures how soon every follower learns of a new leader: n
// electors on one key in this process, the leader resigned `runs` times,
// and for each election the delay from the new leader's OnElected to each
// follower's OnNewLeader with its identity. A watcher hears the leader's
// announcement at once; an heir between two of its rounds, so the bound is
// an heir's lock wait (four fifths of deadlock_timeout, at most
// RenewDeadline) plus a round trip.
func (b *bencher) freshness(n, runs int) error {
	key := leader.KeyFromName(b.name("freshness"))
	type seen struct {
		id string
		at time.Time
	}
	heard := make(chan seen, 64*n)
	elected := make(chan seen, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, n)
	els := map[string]*elector.Elector{}
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("fresh-%d", i)
		e, err := elector.New(elector.Config{
			Connect: elector.DSN(b.dsn), Key: key, Identity: id,
			Callbacks: elector.Callbacks{
				OnElected: func(ctx context.Context, l leader.Leadership) {
					elected <- seen{id, time.Now()}
					<-ctx.Done()
				},
				OnNewLeader: func(identity string) {
					if identity != id && identity != "" {
						heard <- seen{identity, time.Now()}
					}
				},
			},
		})
		if err != nil {
			cancel()
			return err
		}
		els[id] = e
		go func() { e.Run(ctx); done <- struct{}{} }()
	}
	defer func() {
		cancel()
		for i := 0; i < n; i++ {
			<-done
		}
	}()
	if err := waitStanding(ctx, b.admin, key, n); err != nil {
		return err
	}
	var delays []float64
	cur := <-elected
	for run := 0; run < runs; run++ {
		if err := waitQueued(ctx, b.admin, key, min(n-1, lockconn.DefaultHeirs)); err != nil {
			return err
		}
		// Drain what earlier elections left.
		for len(heard) > 0 {
			<-heard
		}
		if err := els[cur.id].Resign(ctx); err != nil {
			return err
		}
		var nxt seen
		select {
		case nxt = <-elected:
		case <-time.After(time.Minute):
			return errors.New("no election within a minute of a resign")
		}
		// Every follower but the new leader hears of it; the old leader
		// too, once it campaigns again.
		got, deadline := 0, time.After(time.Minute)
		for got < n-1 {
			select {
			case h := <-heard:
				if h.id == nxt.id {
					delays = append(delays, float64(h.at.Sub(nxt.at).Microseconds())/1000)
					got++
				}
			case <-deadline:
				return fmt.Errorf("only %d of %d followers heard of the new leader within a minute", got, n-1)
			}
		}
		cur = nxt
	}
	b.add("freshness", fmt.Sprintf("OnElected to every follower's OnNewLeader (%d electors)", n), "ms", "p99 <= 2000", delays)
	return nil
}
