package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/internal/harness/fleet"
	"github.com/pgleader/pgleader/internal/harness/pgtemp"
	"github.com/pgleader/pgleader/leader"
)

const demoTimeout = 30 * time.Second

// withDatabase runs f with --dsn, or with a throwaway PostgreSQL when none
// is given.
func withDatabase(dsn string, stdout io.Writer, opts pgtemp.Options, f func(dsn string, srv *pgtemp.Server) error) error {
	if dsn != "" {
		return f(dsn, nil)
	}
	fmt.Fprintln(stdout, "no --dsn or DATABASE_URL: starting a throwaway PostgreSQL ...")
	srv, err := pgtemp.New(opts)
	if err != nil {
		return err
	}
	defer srv.Close()
	return f(srv.DSN(), srv)
}

func cmdDemo(args []string, stdout, stderr io.Writer) error {
	fs, dsn := newFlags("demo", "demo [--dsn DSN]", "  pgleader demo\n", stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	return withDatabase(dsn.get(), stdout, pgtemp.Options{}, func(dsn string, _ *pgtemp.Server) error {
		return demo(dsn, stdout)
	})
}

func demo(dsn string, out io.Writer) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer admin.Close(ctx)
	name := fmt.Sprintf("pgleader-demo-%d", os.Getpid())
	key := leader.KeyFromName(name)
	f := fleet.New(exe)
	defer f.StopAll()
	n := 0
	add := func() error {
		n++
		_, err := f.Add(fleet.Options{DSN: dsn, Key: name, ID: fmt.Sprintf("candidate-%d", n)})
		return err
	}
	for i := 0; i < 3; i++ {
		if err := add(); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "3 electors (separate processes) campaign for %q (key %s)\n", name, key)
	cur, err := f.Next("elected", demoTimeout)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "  %s leads\n\n", cur.Identity)
	type row struct {
		what string
		took time.Duration
	}
	var rows []row
	step := func(what string, act func(leaderID string) error) error {
		if err := waitQueued(ctx, admin, key, 2); err != nil {
			return err
		}
		fmt.Fprintf(out, "%s (%s) ...\n", what, cur.Identity)
		began := fleet.Mono()
		if err := act(cur.Identity); err != nil {
			return err
		}
		next, err := f.Next("elected", demoTimeout, cur.Identity)
		if err != nil {
			return err
		}
		took := time.Duration(next.Mono - began)
		fmt.Fprintf(out, "  %s leads, %s after the %s\n\n", next.Identity, took.Round(time.Microsecond), what)
		rows = append(rows, row{what, took})
		cur = next
		return nil
	}
	if err := step("resign", func(id string) error { return f.Get(id).Send("resign") }); err != nil {
		return err
	}
	if err := step("SIGKILL of the leader's process", func(id string) error {
		c := f.Get(id)
		f.Remove(id)
		c.Signal(syscall.SIGKILL)
		return add() // keep three candidates
	}); err != nil {
		return err
	}
	if err := step("pg_terminate_backend of the leader's session", func(id string) error {
		_, err := admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", id)
		return err
	}); err != nil {
		return err
	}
	fmt.Fprintln(out, "handover times (from the fault to the new leader's OnElected, CLOCK_MONOTONIC across processes):")
	for _, r := range rows {
		fmt.Fprintf(out, "  %-48s %10s\n", r.what, r.took.Round(time.Microsecond))
	}
	fmt.Fprintln(out, "\nTTL-based electors take 2 to 15 s for the same handovers.")
	return nil
}

// waitQueued waits until n candidates wait for key (so a handover is the
// lock manager's, not a campaign round's).
func waitQueued(ctx context.Context, conn *pgx.Conn, key leader.Key, n int) error {
	deadline := time.Now().Add(demoTimeout)
	for {
		h, err := leader.Holder(ctx, conn, key)
		if err != nil {
			return err
		}
		if h.Held && len(h.Waiters) >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d candidates queued after %s", len(h.Waiters), demoTimeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
