package lock_test

import (
	"context"
	"errors"
	"testing"

	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/leader"
	"github.com/pgleader/pgleader/lock"
)

// Behind PgBouncer in transaction or statement mode, TryRun finds out
// before it takes the lock, even alone, and fails with
// ErrTransactionPooling without running fn. In session mode a second
// runner is skipped as usual.
func TestTryRunBehindPgBouncer(t *testing.T) {
	for _, mode := range []string{"transaction", "statement"} {
		t.Run(mode, func(t *testing.T) {
			bouncer := testpg.StartPgBouncer(t, server(t), mode, 4)
			err := lock.TryRun(context.Background(), leader.DSN(bouncer.DSN()), leader.KeyFromName(t.Name()), lock.Options{Identity: "alone"},
				func(ctx context.Context) error { t.Error("fn ran through a transaction pooler"); return nil })
			if !errors.Is(err, leader.ErrTransactionPooling) {
				t.Fatalf("want ErrTransactionPooling, got %v", err)
			}
		})
	}
	t.Run("session", func(t *testing.T) {
		bouncer := testpg.StartPgBouncer(t, server(t), "session", 4)
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
		if !errors.Is(err, lock.ErrHeld) {
			t.Fatalf("second runner: want ErrHeld, got %v", err)
		}
	})
}
