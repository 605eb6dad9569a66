package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/pgleader/pgleader/internal/harness/fleet"
)

// cmdCandidate is the hidden subcommand behind the bench: one elector
// in its own process, reporting events on stdout.
func cmdCandidate(args []string, stdout, stderr io.Writer) error {
	fs, dsn := newFlags("candidate", "candidate (internal: the bench runs its candidates with it)", "", stderr)
	var o fleet.Options
	fs.StringVar(&o.Key, "key", "", "lock name")
	fs.StringVar(&o.ID, "id", "", "identity")
	fs.DurationVar(&o.Interval, "interval", 0, "renew interval")
	fs.DurationVar(&o.Deadline, "deadline", 0, "renew deadline")
	fs.DurationVar(&o.Lease, "lease", 0, "lease")
	fs.BoolVar(&o.Fencing, "fencing", false, "fencing terms")
	fs.BoolVar(&o.Renews, "renews", false, "report every renew")
	fs.IntVar(&o.Keys, "keys", 0, "run a group member with this many keys (the group is named by --key)")
	fs.BoolVar(&o.SingleConnection, "single-connection", false, "a group member without its crash watch")
	fs.BoolVar(&o.Bare, "bare", false, "no elector: a bare pg_advisory_lock waiter (the bench's reference)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	o.DSN = dsn.get()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return fleet.RunCandidate(ctx, o, os.Stdin, stdout)
}
