package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/leader"
)

func cmdElect(args []string, stdout, stderr io.Writer) error {
	fs, dsn := newFlags("elect", "elect [--dsn DSN] [--identity ID] [--grace D] [--verbose] NAME -- COMMAND [ARGS...]",
		`  pgleader elect scheduler -- ./scheduler --config prod.yaml   # on every replica: one runs it
  pgleader elect --grace 30s consumer -- ./consume                # longer drain on demotion
`, stderr)
	identity := fs.String("identity", "", "identity / application_name (default hostname-pid)")
	grace := fs.Duration("grace", 10*time.Second, "on demotion, SIGTERM the command and SIGKILL it this much later")
	interval := fs.Duration("renew-interval", elector.DefaultRenewInterval, "renew interval")
	deadline := fs.Duration("renew-deadline", elector.DefaultRenewDeadline, "renew deadline (trust window)")
	lease := fs.Duration("lease", elector.DefaultLeaseDuration, "server-side lease")
	verbose := fs.Bool("verbose", false, "log elections and demotions to stderr")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := needDSN(*dsn); err != nil {
		return err
	}
	name, argv, err := splitCommand(fs.Args())
	if err != nil {
		return err
	}
	logger := zap.NewNop()
	if *verbose {
		// Info level: elections, demotions, reconnects, errors; not the
		// debug line of every renew and campaign round.
		cfg := zap.NewDevelopmentConfig()
		cfg.Level = zap.NewAtomicLevelAt(zap.InfoLevel)
		logger, _ = cfg.Build(zap.AddStacktrace(zap.DPanicLevel))
	}
	// pgleader's own SIGINT/SIGTERM stops the election; while the command
	// runs, runChild passes those signals on to it as well.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	e, err := elector.New(elector.Config{
		Connect:  elector.DSN(*dsn),
		Key:      leader.KeyFromName(name),
		Identity: *identity,
		Logger:   logger,
		Callbacks: elector.Callbacks{
			OnElected: func(ctx context.Context, l leader.Leadership) {
				fmt.Fprintf(stderr, "pgleader elect: %s leads %s; starting %q\n", l.Identity, name, argv[0])
				code, err := runChild(ctx, argv, *grace)
				if err != nil {
					fmt.Fprintf(stderr, "pgleader elect: %v\n", err)
				} else if ctx.Err() == nil {
					fmt.Fprintf(stderr, "pgleader elect: command exited with %d; resigning and campaigning again\n", code)
				}
			},
			OnDemoted: func(l leader.Leadership, reason error) {
				fmt.Fprintf(stderr, "pgleader elect: %s stepped down: %v\n", l.Identity, reason)
			},
		},
		RenewInterval: *interval, RenewDeadline: *deadline, LeaseDuration: *lease,
		ReleaseTimeout: *grace + time.Second,
	})
	if err != nil {
		return usageError{err.Error()}
	}
	return e.Run(ctx)
}
