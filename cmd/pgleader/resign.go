package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/leader"
)

// cmdResign asks the leader of NAME to hand over (elector.RequestResign).
func cmdResign(args []string, stdout, stderr io.Writer) error {
	fs, dsn := newFlags("resign", "resign [--dsn DSN] [--to IDENTITY] [--timeout D] NAME",
		`  pgleader resign billing-cron                 # any waiting candidate takes over
  pgleader resign billing-cron --to worker-7   # worker-7 (it must stand by) takes over
The leader checks the asker's role: a superuser, a member of the leader's
own role, or of a role its Config.ResignRequests.Roles names may ask.
Exit codes: 0 handed over, 3 nobody leads NAME, 4 refused or no such
candidate, 1 no answer or another error.
`, stderr)
	to := fs.String("to", "", "identity of the candidate to hand over to (default: any)")
	timeout := fs.Duration("timeout", time.Minute, "give up after this long (the old leader may drain that long)")
	name, err := parseName(fs, args, false)
	if err != nil {
		return err
	}
	if err := needDSN(dsn.get()); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	ho, err := elector.RequestResign(ctx, elector.DSN(dsn.get()), leader.KeyFromName(name), *to)
	switch {
	case errors.Is(err, leader.ErrNoLeader):
		fmt.Fprintf(stderr, "pgleader resign: NO LEADER for %s\n", name)
		return exitCode(exitNoLeader)
	case errors.Is(err, leader.ErrNotCandidate), errors.Is(err, leader.ErrRefused):
		fmt.Fprintf(stderr, "pgleader resign: %s\n", strings.TrimPrefix(err.Error(), "pgleader: "))
		return exitCode(exitRefused)
	case err != nil:
		return err
	}
	fmt.Fprintf(stdout, "%s: %s handed over to %s (seen after %s)\n", name, show(ho.From), show(ho.To), ho.Took.Round(10*time.Microsecond))
	if *to != "" && ho.To != *to {
		fmt.Fprintf(stderr, "pgleader resign: %s leads, not %s\n", show(ho.To), *to)
		return exitCode(exitRefused)
	}
	return nil
}

// parseName parses flags before and after the one positional NAME; with
// optional, NAME may be left out ("").
func parseName(fs *flag.FlagSet, args []string, optional bool) (string, error) {
	if err := parseFlags(fs, args); err != nil {
		return "", err
	}
	if fs.NArg() == 0 {
		if optional {
			return "", nil
		}
		return "", usageError{msg: "NAME is required"}
	}
	name := fs.Arg(0)
	if err := fs.Parse(fs.Args()[1:]); err != nil {
		return "", err
	}
	if fs.NArg() != 0 {
		return "", usageError{msg: fmt.Sprintf("one NAME expected, got %q too", fs.Args())}
	}
	return name, nil
}
