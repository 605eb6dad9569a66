package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/leader"
)

// dbload measures what a standing fleet costs the database it shares: the
// server's CPU, from its own processes' accounting (/proc, so the server
// must run on this machine); the lines the fleet adds to the server log
// (the throwaway server's only); and pgbench -S throughput with and without
// the fleet, alternated in pairs so drift cancels, with a 3-elector fleet's
// ratio as the noise reference.
func (b *bencher) dbload(sizes []int, window time.Duration, pairs int) error {
	ctx := context.Background()
	var postmaster int
	if err := b.admin.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&postmaster); err == nil {
		postmaster = parentPid(postmaster)
	}
	for _, n := range sizes {
		stop, err := b.standingFleet(n)
		if err != nil {
			return err
		}
		time.Sleep(3 * time.Second) // every follower queued, the first rounds done
		cpu0, logs0 := serverCPU(postmaster), b.logLines()
		time.Sleep(window)
		cpu := (serverCPU(postmaster) - cpu0) / window.Seconds()
		logs := b.logLines() - logs0
		stop()
		scen := fmt.Sprintf("dbload-%d", n)
		if cpu >= 0 && postmaster > 0 {
			b.add(scen, fmt.Sprintf("server CPU, 1 leader + %d followers", n-1), "% core", "<= 2 (200)", []float64{100 * cpu})
		}
		if logs >= 0 {
			b.add(scen, fmt.Sprintf("server log lines in %s", window), "lines", "0", []float64{float64(logs)})
		}
		fmt.Fprintf(b.out, "bench: dbload %d electors: server CPU %.2f%% of a core, %d log lines in %s\n", n, 100*cpu, logs, window)
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
			stop, err := b.standingFleet(n)
			if err != nil {
				return err
			}
			time.Sleep(2 * time.Second)
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

// standingFleet starts n electors on one key in this process, with the
// default timings, and returns what stops them.
func (b *bencher) standingFleet(n int) (func(), error) {
	key := leader.KeyFromName(b.name("dbload"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, n)
	for i := 0; i < n; i++ {
		e, err := elector.New(elector.Config{
			Connect: elector.DSN(b.dsn), Key: key, Identity: fmt.Sprintf("dbload-%d", i),
			Callbacks: elector.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) { <-ctx.Done() }},
		})
		if err != nil {
			cancel()
			return nil, err
		}
		go func() { e.Run(ctx); done <- struct{}{} }()
	}
	return func() {
		cancel()
		for i := 0; i < n; i++ {
			<-done
		}
	}, nil
}

func (b *bencher) logLines() int {
	if b.srv == nil {
		return -1
	}
	return b.srv.LogLines()
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

// parentPid is a process's parent, from /proc (0 when unknown).
func parentPid(pid int) int {
	f := procStat(pid)
	if len(f) < 2 {
		return 0
	}
	pp, _ := strconv.Atoi(f[1])
	return pp
}

// procStat returns the fields of /proc/PID/stat after the command name.
func procStat(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		s = s[i+1:]
	}
	return strings.Fields(s)
}

// serverCPU sums the CPU seconds (user and system, as the kernel accounts
// them) of the postmaster and all its children, including the children
// that already exited (cutime, cstime of the postmaster). -1 when unknown.
func serverCPU(postmaster int) float64 {
	if postmaster <= 0 {
		return -1
	}
	const hz = 100 // USER_HZ on Linux
	ticks := func(f []string, i int) float64 {
		if len(f) <= i {
			return 0
		}
		v, _ := strconv.ParseFloat(f[i], 64)
		return v
	}
	// After the ")": state=0 ppid=1 ... utime=11 stime=12 cutime=13 cstime=14.
	pm := procStat(postmaster)
	total := ticks(pm, 11) + ticks(pm, 12) + ticks(pm, 13) + ticks(pm, 14)
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == postmaster {
			continue
		}
		if f := procStat(pid); len(f) > 14 && f[1] == strconv.Itoa(postmaster) {
			total += ticks(f, 11) + ticks(f, 12)
		}
	}
	return total / hz
}
