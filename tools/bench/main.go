// Command bench measures pgleader's handovers and what a fleet costs the
// database: resign, kill, backend, partition, pause, restart, crowd,
// freshness, idle, dbload and group (docs/benchmarks.md). Candidates and
// group members run as separate processes (this binary's hidden candidate
// subcommand).
//
//	go run ./tools/bench                                  # every default scenario on a throwaway PostgreSQL
//	go run ./tools/bench --scenarios group --group-runs 20
//
// It is a lab, not part of the pgleader CLI that users install: it starts
// and kills processes and writes to the database it runs against (pgbench
// tables, fencing terms). By default it starts a throwaway server of its
// own; --dsn runs it against another server only with
// --i-own-this-database, and the scenarios that need the server's own
// processes or log (restart, dbload, group) refuse it. Server CPU is read
// from the throwaway server's processes; it is never measured for a --dsn
// server.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgleader/pgleader/internal/harness/pgtemp"
	"github.com/pgleader/pgleader/leader"
)

func main() {
	args, f := os.Args[1:], cmdBench
	if len(args) > 0 && args[0] == "candidate" {
		args, f = args[1:], cmdCandidate
	}
	err := f(args, os.Stdout, os.Stderr)
	var ue usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.As(err, &ue):
		if !ue.printed {
			fmt.Fprintln(os.Stderr, "bench:", err)
		}
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// usageError marks errors that exit 2; printed: the flag package has
// already said it.
type usageError struct {
	msg     string
	printed bool
}

func (e usageError) Error() string { return e.msg }

// newFlags makes a FlagSet with --dsn (never printed: see dsnFlag).
func newFlags(name, synopsis, examples string, stderr io.Writer) (*flag.FlagSet, *dsnFlag) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	dsn := &dsnFlag{}
	fs.Var(dsn, "dsn", "a PostgreSQL server to run against instead of a throwaway one (needs --i-own-this-database)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: go run ./tools/bench %s\n\nFlags:\n", synopsis)
		fs.PrintDefaults()
		if examples != "" {
			fmt.Fprintf(stderr, "\nExamples:\n%s", examples)
		}
	}
	return fs, dsn
}

// dsnFlag is --dsn; its String, which the flag package prints, masks the
// password.
type dsnFlag struct{ v string }

func (d *dsnFlag) String() string {
	if d == nil {
		return ""
	}
	return leader.RedactDSN(d.v)
}

func (d *dsnFlag) Set(v string) error { d.v = v; return nil }

func (d *dsnFlag) get() string { return d.v }

// parseFlags parses args; a bad flag is a usage error.
func parseFlags(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		return usageError{msg: err.Error(), printed: true}
	}
	return err
}

// withDatabase runs f against dsn, or against a throwaway server.
func withDatabase(dsn string, stdout io.Writer, opts pgtemp.Options, f func(dsn string, srv *pgtemp.Server) error) error {
	if dsn != "" {
		return f(dsn, nil)
	}
	fmt.Fprintln(stdout, "bench: starting a throwaway PostgreSQL ...")
	srv, err := pgtemp.New(opts)
	if err != nil {
		return err
	}
	defer srv.Close()
	return f(srv.DSN(), srv)
}

// queueTimeout bounds how long the bench waits for its candidates to queue.
const queueTimeout = 30 * time.Second

// waitQueued waits until n candidates wait for key (so a handover is the
// lock manager's, not a campaign round's).
func waitQueued(ctx context.Context, conn *pgx.Conn, key leader.Key, n int) error {
	deadline := time.Now().Add(queueTimeout)
	for {
		h, err := leader.Holder(ctx, conn, key)
		if err != nil {
			return err
		}
		if h.Held && len(h.Waiters) >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d candidates queued after %s", len(h.Waiters), queueTimeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
