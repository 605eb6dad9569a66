package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/pgleader/pgleader/contrib/promleader"
	"github.com/pgleader/pgleader/health"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/leader"
)

func cmdElect(args []string, stdout, stderr io.Writer) error {
	fs, dsn := newFlags("elect", "elect [--dsn DSN] [--identity ID] [--value V] [-n N] [--priority P] [--version V --strategy S] [--grace D] [--fencing] [--listen ADDR] [--verbose] NAME -- COMMAND [ARGS...]",
		`  pgleader elect scheduler -- ./scheduler --config prod.yaml   # on every replica: one runs it
  pgleader elect --grace 30s consumer -- ./consume                # longer drain on demotion
  pgleader elect --fencing --listen :8080 consumer -- ./consume   # terms and history; probes and metrics
  pgleader elect -n 3 backfill -- ./backfill                      # at most 3 replicas run it; $PGLEADER_SLOT is 0, 1 or 2
  pgleader elect --value http://10.0.0.7:8080 web -- ./serve      # the leader's address, for pgleader status and ObserveValues
  pgleader elect --version 1.8.0 --strategy newest job -- ./job   # leadership moves to the newest version standing (docs/rolling-upgrades.md)
The command gets PGLEADER_NAME, PGLEADER_IDENTITY, with -n PGLEADER_SLOT, and,
with --fencing, PGLEADER_TERM and PGLEADER_TERMS_TABLE (for leader.Fence) in
its environment. With -n N every replica must pass the same N; slot i is
the election NAME#i (NAME itself for slot 0), as pgleader status shows it.
--listen serves /livez, /readyz (every replica is ready: see docs/kubernetes.md),
/status and /metrics; --allow-resign adds POST /resign.
`, stderr)
	identity := fs.String("identity", "", "identity / application_name (default hostname-pid)")
	value := fs.String("value", "", "the leader's value (elector.Config.Value), e.g. its address: shown by pgleader status, read by ObserveValues and followers; kept in the values table (created when missing)")
	slots := fs.Int("n", 1, fmt.Sprintf("a semaphore: at most N replicas lead NAME at once, one slot each (1 to %d; every replica must pass the same N)", elector.MaxSemaphoreSlots))
	grace := fs.Duration("grace", 10*time.Second, "on demotion, SIGTERM the command and SIGKILL it this much later")
	interval := fs.Duration("renew-interval", elector.DefaultRenewInterval, "renew interval")
	deadline := fs.Duration("renew-deadline", elector.DefaultRenewDeadline, "renew deadline (trust window)")
	lease := fs.Duration("lease", elector.DefaultLeaseDuration, "server-side lease")
	priority := fs.Int("priority", 0, "preferred leaders: a leader hands over to a standing candidate of a higher priority")
	version := fs.String("version", "", "this replica's semantic version, for --strategy newest or oldest")
	strategy := fs.String("strategy", "priority", "which candidate a leader prefers: priority, newest (version) or oldest (version)")
	verbose := fs.Bool("verbose", false, "log elections and demotions to stderr")
	fencing := fs.Bool("fencing", false, "fencing terms and the history table (created when missing)")
	listen := fs.String("listen", "", "serve /livez, /readyz, /status and /metrics on this address")
	allowResign := fs.Bool("allow-resign", false, "with --listen, also serve POST /resign")
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
	strat, ok := map[string]leader.Strategy{"priority": leader.ByPriority, "newest": leader.NewestVersion, "oldest": leader.OldestVersion}[*strategy]
	if !ok {
		return usageError{msg: fmt.Sprintf("--strategy must be priority, newest or oldest, got %q", *strategy)}
	}
	logger := zap.NewNop()
	if *verbose {
		// Info level: elections, demotions, reconnects, errors; not the
		// debug line of every renew and campaign round.
		cfg := zap.NewDevelopmentConfig()
		cfg.Level = zap.NewAtomicLevelAt(zap.InfoLevel)
		logger, _ = cfg.Build(zap.AddStacktrace(zap.DPanicLevel))
	}
	var obs leader.Observer
	reg := prometheus.NewRegistry()
	if *listen != "" {
		m, err := promleader.NewMetrics(reg)
		if err != nil {
			return err
		}
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		obs = m
	} else if *allowResign {
		return usageError{msg: "--allow-resign needs --listen"}
	}
	// pgleader's own SIGINT/SIGTERM stops the election; while the command
	// runs, runChild passes those signals on to it as well.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// A command that cannot start ends the election with its error (exit
	// 1), before campaigning when it is not found at all, rather than
	// leading, failing and campaigning again for ever.
	if _, err := exec.LookPath(argv[0]); err != nil {
		return fmt.Errorf("cannot start %q: %w", argv[0], err)
	}
	ctx, cancelRun := context.WithCancelCause(ctx)
	defer cancelRun(nil)
	var startErr atomic.Pointer[error]
	var sem *elector.Semaphore
	cfg := elector.Config{
		Connect:  elector.DSN(dsn.get()),
		Key:      leader.KeyFromName(name),
		Identity: *identity,
		Priority: *priority,
		Version:  *version,
		Strategy: strat,
		Logger:   logger,
		Callbacks: elector.Callbacks{
			OnElected: func(ctx context.Context, l leader.Leadership) {
				fmt.Fprintf(stderr, "pgleader elect: %s leads %s; starting %q\n", l.Identity, name, argv[0])
				env := []string{"PGLEADER_NAME=" + name, "PGLEADER_IDENTITY=" + l.Identity}
				if sem != nil {
					slot, _ := sem.Slot()
					env = append(env, fmt.Sprintf("PGLEADER_SLOT=%d", slot))
				}
				if l.TermsTable != "" {
					env = append(env, fmt.Sprintf("PGLEADER_TERM=%d", l.Term), "PGLEADER_TERMS_TABLE="+l.TermsTable)
				}
				code, err := runChild(ctx, argv, *grace, env...)
				if err != nil {
					err = fmt.Errorf("cannot start %q: %w", argv[0], err)
					startErr.Store(&err)
					cancelRun(err)
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
		Fencing:        elector.Fencing{Enabled: *fencing},
		Observer:       obs,
	}
	if *value != "" {
		cfg.Value = []byte(*value)
	}
	var c elector.Candidate
	var run func(context.Context) error
	if *slots == 1 {
		e, err := elector.New(cfg)
		if err != nil {
			return usageError{msg: err.Error()}
		}
		c, run = e, e.Run
	} else {
		sem, err = elector.NewSemaphore(cfg, *slots)
		if err != nil {
			return usageError{msg: err.Error()}
		}
		c, run = sem, sem.Run
	}
	if *listen != "" {
		stopServe, err := serveProbes(*listen, c, reg, *allowResign, stderr)
		if err != nil {
			return err
		}
		defer stopServe()
	}
	err = run(ctx)
	if p := startErr.Load(); p != nil {
		return *p
	}
	return err
}

// serveProbes serves the elector's probes, status and metrics on addr
// until the returned function stops it.
func serveProbes(addr string, e elector.Candidate, reg *prometheus.Registry, allowResign bool, stderr io.Writer) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	// Every replica is ready (not only the leader): a rollout must not
	// wait for followers to lead (docs/kubernetes.md).
	c := health.NewChecker(e, health.Options{AllowResign: allowResign})
	mux := http.NewServeMux()
	mux.Handle("/", c.Handler())
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(stderr, "pgleader elect: serving /livez, /readyz, /status and /metrics on %s\n", ln.Addr())
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(stderr, "pgleader elect: %v\n", err)
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}, nil
}
