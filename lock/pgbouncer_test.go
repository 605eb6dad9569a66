package lock_test

import (
	"context"
	"errors"
	"testing"

	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/leader"
	"github.com/pgleader/pgleader/lock"
)

// Behind PgBouncer in transaction mode, a second runner lands on the
// server connection that holds the first one's lock: TryRun detects it and
// fails with ErrTransactionPooling instead of stacking the lock. In session
// mode it is skipped as usual.
func TestTryRunBehindPgBouncer(t *testing.T) {
	for _, mode := range []string{"transaction", "session"} {
		t.Run(mode, func(t *testing.T) {
			poolSize := 4
			if mode == "transaction" {
				poolSize = 1 // both runners share one server connection
			}
			bouncer := testpg.StartPgBouncer(t, server(t), mode, poolSize)
			key := leader.KeyFromName(t.Name())
			holding := make(chan struct{})
			release := make(chan struct{})
			first := make(chan error, 1)
			go func() {
				first <- lock.TryRun(context.Background(), leader.DSN(bouncer.DSN()), key, lock.Options{Identity: "first"},
					func(ctx context.Context) error { close(holding); <-release; return nil })
			}()
			select {
			case <-holding:
			case err := <-first:
				t.Fatalf("first runner: %v", err)
			}
			ran := false
			err := lock.TryRun(context.Background(), leader.DSN(bouncer.DSN()), key, lock.Options{Identity: "second"},
				func(ctx context.Context) error { ran = true; return nil })
			close(release)
			waitFor(t, first, "the first runner")
			if ran {
				t.Fatal("the second runner ran while the first held the lock")
			}
			want := lock.ErrHeld
			if mode == "transaction" {
				want = leader.ErrTransactionPooling
			}
			if !errors.Is(err, want) {
				t.Fatalf("second runner: want %v, got %v", want, err)
			}
		})
	}
}
