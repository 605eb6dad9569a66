// Command basic runs three electors on one key and shows two handovers: a
// graceful resign, and a leader whose backend is killed. It uses
// $DATABASE_URL when set; otherwise it starts a throwaway PostgreSQL.
//
//	go run ./examples/basic
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/leader"
	"github.com/pgleader/pgleader/pgleadertest"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "basic:", err)
		os.Exit(1)
	}
}

type election struct {
	id string
	at time.Time
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	dsn, release, err := pgleadertest.Database()
	if err != nil {
		return err
	}
	defer release()

	logger, _ := zap.NewDevelopment(zap.IncreaseLevel(zap.WarnLevel), zap.AddStacktrace(zap.DPanicLevel))
	defer logger.Sync()
	key := leader.KeyFromName("examples/basic")
	elected := make(chan election, 16)
	electors := map[string]*elector.Elector{}
	var wg sync.WaitGroup
	runCtx, cancel := context.WithCancel(ctx)
	defer func() { cancel(); wg.Wait() }()
	for _, id := range []string{"worker-a", "worker-b", "worker-c"} {
		e, err := elector.New(elector.Config{
			Connect:  elector.DSN(dsn),
			Key:      key,
			Identity: id,
			Logger:   logger,
			Callbacks: elector.Callbacks{
				OnElected: func(ctx context.Context, l leader.Leadership) {
					elected <- election{l.Identity, time.Now()}
					<-ctx.Done() // do the leader's work here until ctx ends
				},
				OnDemoted: func(l leader.Leadership, reason error) {
					fmt.Printf("  %s stepped down: %v\n", l.Identity, reason)
				},
			},
		})
		if err != nil {
			return err
		}
		electors[id] = e
		wg.Add(1)
		go func() { defer wg.Done(); e.Run(runCtx) }()
	}

	next := func() (election, error) {
		select {
		case el := <-elected:
			return el, nil
		case <-time.After(30 * time.Second):
			return election{}, fmt.Errorf("no leader within 30s")
		case <-ctx.Done():
			return election{}, ctx.Err()
		}
	}
	first, err := next()
	if err != nil {
		return err
	}
	fmt.Printf("%s leads (key %s)\n", first.id, key)
	time.Sleep(300 * time.Millisecond) // let the followers queue on the lock

	fmt.Printf("%s resigns ...\n", first.id)
	began := time.Now()
	go electors[first.id].Resign(ctx)
	second, err := next()
	if err != nil {
		return err
	}
	fmt.Printf("%s leads: handover took %s after Resign\n", second.id, second.at.Sub(began).Round(time.Microsecond))
	time.Sleep(300 * time.Millisecond)

	fmt.Printf("killing %s's backend with pg_terminate_backend ...\n", second.id)
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer admin.Close(context.Background())
	began = time.Now()
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", second.id); err != nil {
		return err
	}
	third, err := next()
	if err != nil {
		return err
	}
	fmt.Printf("%s leads: handover took %s after the kill\n", third.id, third.at.Sub(began).Round(time.Microsecond))

	h, err := leader.Holder(ctx, admin, key)
	if err != nil {
		return err
	}
	fmt.Printf("pg_locks agrees: %s holds the lock, %d candidates wait\n", h.Identity(), len(h.Waiters))
	return nil
}
