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
	fs, dsn := newFlags("lock", "lock [--dsn DSN] [--wait D] [--identity ID] [--grace D] NAME -- COMMAND [ARGS...]",
		`  pgleader lock nightly-report -- ./report.sh          # run on one replica; others exit 75
  pgleader lock --wait 5m migrate -- ./migrate up       # wait for the lock up to 5 minutes
  pgleader lock backup -- pg_dump -Fc app -f app.dump || [ $? -eq 75 ]
`, stderr)
	wait := fs.Duration("wait", 0, "wait this long for a held lock (default: exit 75 at once)")
	identity := fs.String("identity", "", "application_name of the lock session (default hostname-pid)")
	grace := fs.Duration("grace", 10*time.Second, "after the lock is lost, SIGTERM the command and SIGKILL it this much later")
	conflict := fs.Int("conflict-exit-code", exitLockHeld, "exit code when the lock is held by another session")
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
	code := 0
	err = lock.TryRun(context.Background(), leader.DSN(dsn.get()), leader.KeyFromName(name),
		lock.Options{Identity: *identity, Wait: *wait},
		func(ctx context.Context) error {
			var err error
			code, err = runChild(ctx, argv, *grace)
			return err
		})
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
