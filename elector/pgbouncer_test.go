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
		r := newRecorder(t)
		key := testKey(t)
		start(t, r, opts{dsn: bouncer.DSN(), key: key, id: "pgb-a"})
		r.next("elected", "pgb-a")
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

// waitWaiter waits until id queues for key's lock.
func waitWaiter(t *testing.T, srv *testpg.Server, key leader.Key, id string) {
	t.Helper()
	conn := mustConn(t, srv)
	deadline := time.Now().Add(waitLong)
	for {
		h, err := leader.Holder(context.Background(), conn, key)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range h.Waiters {
			if w.Identity == id {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never queued for the lock", id)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
