package elector_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/group"
	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/leader"
)

// Behind PgBouncer in transaction or statement mode, an elector or a
// group member finds out before it takes anything, even alone, and Run
// fails with ErrTransactionPooling; no OnElected runs. In session mode
// elections work as usual.
func TestElectorBehindPgBouncer(t *testing.T) {
	srv := sharedServer(t)
	for _, mode := range []string{"transaction", "statement"} {
		for _, pool := range []int{1, 4} {
			t.Run(fmt.Sprintf("%s-%d", mode, pool), func(t *testing.T) {
				bouncer := testpg.StartPgBouncer(t, srv, mode, pool)
				key := testKey(t)
				cb := elector.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) {
					t.Errorf("%s elected through a pooler in %s mode", l.Identity, mode)
					<-ctx.Done()
				}}
				e, err := elector.New(elector.Config{
					Connect: elector.DSN(bouncer.DSN()), Key: key, Identity: "pgb-a",
					RenewInterval: tInterval, RenewDeadline: tDeadline, LeaseDuration: tLease, Callbacks: cb,
				})
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), waitLong)
				defer cancel()
				if err := e.Run(ctx); !errors.Is(err, leader.ErrTransactionPooling) || !strings.Contains(err.Error(), "PgBouncer") {
					t.Fatalf("Elector: want ErrTransactionPooling naming PgBouncer, got %v", err)
				}
				g, err := group.New(group.Config{
					Connect: leader.DSN(bouncer.DSN()), Group: t.Name(), Keys: []leader.Key{leader.KeyFromName(t.Name() + "/0"), leader.KeyFromName(t.Name() + "/1")},
					Identity: "pgb-g", RenewInterval: tInterval, RenewDeadline: tDeadline, LeaseDuration: tLease,
					Callbacks: group.Callbacks{OnElected: cb.OnElected, OnDemoted: cb.OnDemoted},
				})
				if err != nil {
					t.Fatal(err)
				}
				if err := g.Run(ctx); !errors.Is(err, leader.ErrTransactionPooling) {
					t.Fatalf("Group: want ErrTransactionPooling, got %v", err)
				}
			})
		}
	}
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
