package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/pgleader/pgleader/leader"
	"github.com/pgleader/pgleader/lock"
)

func cmdLock(args []string, stdout, stderr io.Writer) error {
	fs, dsn := newFlags("lock", "lock [--dsn DSN] [--wait D] [-n N] [--identity ID] [--grace D] NAME -- COMMAND [ARGS...]",
		`  pgleader lock nightly-report -- ./report.sh          # run on one replica; others exit 75
  pgleader lock --wait 5m migrate -- ./migrate up       # wait for the lock up to 5 minutes
  pgleader lock backup -- pg_dump -Fc app -f app.dump || [ $? -eq 75 ]
  pgleader lock -n 3 --wait 1h backfill -- ./backfill   # at most 3 replicas at once; $PGLEADER_SLOT is 0, 1 or 2
`, stderr)
	wait := fs.Duration("wait", 0, "wait this long for a held lock (default: exit 75 at once)")
	identity := fs.String("identity", "", "application_name of the lock session (default hostname-pid)")
	grace := fs.Duration("grace", 10*time.Second, "after the lock is lost, SIGTERM the command and SIGKILL it this much later")
	conflict := fs.Int("conflict-exit-code", exitLockHeld, "exit code when the lock is held by another session")
	slots := fs.Int("n", 1, "a semaphore: at most N commands run at once under NAME (every caller must pass the same N); the command gets its slot in $PGLEADER_SLOT")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := needDSN(dsn.get()); err != nil {
		return err
	}
	name, argv, err := splitCommand(fs.Args())
	if err != nil {
		return err
	}
	if *slots < 1 || *slots > lock.MaxSlots {
		return usageError{msg: fmt.Sprintf("-n must be between 1 and %d, got %d", lock.MaxSlots, *slots)}
	}
	code := 0
	key, opts := leader.KeyFromName(name), lock.Options{Identity: *identity, Wait: *wait}
	if *slots == 1 {
		err = lock.TryRun(context.Background(), leader.DSN(dsn.get()), key, opts,
			func(ctx context.Context) error {
				var err error
				code, err = runChild(ctx, argv, *grace)
				return err
			})
	} else {
		err = lock.TryRunN(context.Background(), leader.DSN(dsn.get()), key, *slots, opts,
			func(ctx context.Context, slot int) error {
				var err error
				code, err = runChild(ctx, argv, *grace, fmt.Sprintf("PGLEADER_SLOT=%d", slot))
				return err
			})
	}
	var held *lock.HeldError
	switch {
	case errors.As(err, &held):
		fmt.Fprintf(stderr, "pgleader lock: %v\n", err)
		return exitCode(*conflict)
	case err != nil:
		return err
	}
	return exitCode(code)
}
