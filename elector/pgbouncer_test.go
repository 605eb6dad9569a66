package elector_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/leader"
)

// Behind PgBouncer in transaction mode the second elector shares the
// leader's server connection; it detects that and Run fails with
// ErrTransactionPooling. In session mode elections work as usual.
func TestElectorBehindPgBouncer(t *testing.T) {
	srv := sharedServer(t)
	t.Run("transaction", func(t *testing.T) {
		bouncer := testpg.StartPgBouncer(t, srv, "transaction", 1)
		key := testKey(t)
		// A leads alone: behind the pooler it cannot tell yet.
		aElected := make(chan struct{})
		a, err := elector.New(elector.Config{
			Connect: elector.DSN(bouncer.DSN()), Key: key, Identity: "pgb-a",
			RenewInterval: tInterval, RenewDeadline: tDeadline, LeaseDuration: tLease,
			Callbacks: elector.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) { close(aElected); <-ctx.Done() }},
		})
		if err != nil {
			t.Fatal(err)
		}
		actx, acancel := context.WithCancel(context.Background())
		aDone := make(chan error, 1)
		go func() { aDone <- a.Run(actx) }()
		defer acancel()
		recv(t, aElected, "a's election")
		e, err := elector.New(elector.Config{
			Connect: elector.DSN(bouncer.DSN()), Key: key, Identity: "pgb-b",
			RenewInterval: tInterval, RenewDeadline: tDeadline, LeaseDuration: tLease,
			Callbacks: elector.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) {
				t.Error("elected through a transaction pooler while another elector leads")
				<-ctx.Done()
			}},
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), waitLong)
		defer cancel()
		if err := e.Run(ctx); !errors.Is(err, leader.ErrTransactionPooling) {
			t.Fatalf("want ErrTransactionPooling, got %v", err)
		}
		// B overwrote the session token on the shared backend: A's next
		// renew sees it, and A gives up too.
		select {
		case err := <-aDone:
			if !errors.Is(err, leader.ErrTransactionPooling) {
				t.Fatalf("leader A: want ErrTransactionPooling, got %v", err)
			}
		case <-time.After(waitLong):
			t.Fatal("leader A kept leading on a shared pooled backend")
		}
	})
	t.Run("session", func(t *testing.T) {
		bouncer := testpg.StartPgBouncer(t, srv, "session", 4)
		r := newRecorder(t)
		key := testKey(t)
		a := start(t, r, opts{dsn: bouncer.DSN(), key: key, id: "pgs-a"})
		r.next("elected", "pgs-a")
		start(t, r, opts{dsn: bouncer.DSN(), key: key, id: "pgs-b"})
		waitWaiter(t, srv, key, "pgs-b")
		if err := a.e.Resign(context.Background()); err != nil {
			t.Fatal(err)
		}
		if e := r.next("elected", ""); e.id == "pgs-a" {
			// a was re-elected: only possible if b was not campaigning
			t.Fatalf("after a's resign, a was elected again")
		}
	})
}
