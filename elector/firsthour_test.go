package elector_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/leader"
)

// A program that waits to lead learns of an error Run gives up on: the
// Quick start's shape (go e.Run(ctx), then wait) cannot hang silently.
func TestWaitElected(t *testing.T) {
	srv := sharedServer(t)
	ctx := context.Background()
	for _, sql := range []string{
		"DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '" + testpg.PasswordRole + "') THEN CREATE ROLE " + testpg.PasswordRole + " NOLOGIN; END IF; END$$",
		"CREATE ROLE we_user LOGIN PASSWORD 'right' IN ROLE " + testpg.PasswordRole,
	} {
		srv.Exec(ctx, sql) // the first may exist already
	}
	cfg := func(dsn string) elector.Config {
		return elector.Config{Connect: elector.DSN(dsn), Key: testKey(t),
			Callbacks:     elector.Callbacks{OnElected: func(ctx context.Context, _ leader.Leadership) { <-ctx.Done() }},
			RenewInterval: tInterval, RenewDeadline: tDeadline, LeaseDuration: tLease}
	}
	t.Run("elected", func(t *testing.T) {
		e, err := elector.New(cfg(srv.DSN()))
		if err != nil {
			t.Fatal(err)
		}
		rctx, stop := context.WithCancel(ctx)
		go e.Run(rctx)
		defer func() { stop(); <-e.Done() }()
		if err := e.WaitElected(ctx); err != nil || !e.IsLeader() {
			t.Fatalf("WaitElected: %v (leader %v)", err, e.IsLeader())
		}
	})
	t.Run("wrong password", func(t *testing.T) {
		e, err := elector.New(cfg(fmt.Sprintf("postgres://we_user:wrong@%s/postgres?sslmode=disable", srv.Addr())))
		if err != nil {
			t.Fatal(err)
		}
		go e.Run(ctx)
		began := time.Now()
		err = e.WaitElected(ctx)
		if !errors.Is(err, leader.ErrRejected) || !strings.Contains(err.Error(), "password authentication failed") {
			t.Fatalf("WaitElected: want ErrRejected with the server's message, got %v", err)
		}
		<-e.Done()
		if !errors.Is(e.Err(), leader.ErrRejected) {
			t.Fatalf("Err: %v", e.Err())
		}
		t.Logf("the error reached the waiter after %s", time.Since(began).Round(time.Millisecond))
	})
	t.Run("stopped", func(t *testing.T) {
		e, err := elector.New(cfg(srv.DSN()))
		if err != nil {
			t.Fatal(err)
		}
		rctx, stop := context.WithCancel(ctx)
		stop() // Run returns at once, before any election
		go e.Run(rctx)
		if err := e.WaitElected(ctx); !errors.Is(err, leader.ErrNotLeader) {
			t.Fatalf("WaitElected after Run stopped: %v", err)
		}
	})
	t.Run("context", func(t *testing.T) {
		e, err := elector.New(cfg(srv.DSN()))
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(ctx)
		cancel() // never runs
		if err := e.WaitElected(wctx); !errors.Is(err, context.Canceled) || e.Err() != nil {
			t.Fatalf("WaitElected with an ended context: %v, Err %v", err, e.Err())
		}
	})
}

// An empty connection string (an unset DATABASE_URL) is a configuration
// error at New, naming the variable, not a connection to the local socket
// retried for ever.
func TestEmptyDSNFailsAtNew(t *testing.T) {
	t.Setenv("PGHOST", "")
	t.Setenv("PGSERVICE", "")
	t.Setenv("PGDATABASE", "")
	_, err := elector.New(elector.Config{Connect: elector.DSN(""), Key: testKey(t),
		Callbacks: elector.Callbacks{OnElected: func(context.Context, leader.Leadership) {}}})
	var ce *elector.ConfigError
	if !errors.As(err, &ce) || ce.Field != "Connect" || !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Fatalf("New with an empty DSN: %v", err)
	}
}

// attemptCounter counts reconnect attempts (leader.Observer).
type attemptCounter struct {
	leader.NopObserver
	n atomic.Int64
}

func (a *attemptCounter) Reconnecting(leader.Key, string, int, time.Duration, error) { a.n.Add(1) }

// An outage does not flood the log: the first failed attempt is logged
// with its cause, and the next ones only when the cause changes or a
// minute has passed (here: dozens of attempts, one line).
func TestOutageLogsOnce(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	attempts := &attemptCounter{}
	e, err := elector.New(elector.Config{Connect: elector.DSN("postgres://nobody@127.0.0.1:1/db?connect_timeout=1"), Key: testKey(t),
		Callbacks:     elector.Callbacks{OnElected: func(ctx context.Context, _ leader.Leadership) { <-ctx.Done() }},
		RenewInterval: tInterval, RenewDeadline: tDeadline, LeaseDuration: tLease, ReconnectMaxDelay: 20 * time.Millisecond,
		Logger: zap.New(core), Observer: attempts})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	eventually(t, "twenty failed attempts", func() (bool, string) {
		return attempts.n.Load() >= 20, fmt.Sprint(attempts.n.Load(), " attempts")
	})
	cancel()
	<-done
	if n := logs.FilterMessageSnippet("reconnecting").Len(); n != 1 {
		t.Fatalf("%d reconnect lines for %d attempts with one cause, want 1", n, attempts.n.Load())
	}
	if l := logs.FilterMessage("reconnecting").All(); len(l) != 1 || l[0].ContextMap()["error"] == nil {
		t.Fatalf("the line does not say why: %v", l)
	}
}
