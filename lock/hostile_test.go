package lock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/leader"
	"github.com/pgleader/pgleader/lock"
)

// A role whose search_path reaches another role's objects before
// pg_catalog (testpg.Roles.Shadow: every try "succeeds", pg_locks is
// empty): the one-shot locks, Holder and the pool guard still lock, see
// and release the real locks.
func TestShadowedBuiltinsOneShot(t *testing.T) {
	srv := server(t)
	r := testpg.NewRoles(t, srv)
	r.Shadow(t)
	ctx := context.Background()
	app := func() *pgx.Conn {
		c, err := pgx.Connect(ctx, r.AppDSN)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	key := leader.KeyFromName(t.Name())

	t.Run("TryRun", func(t *testing.T) {
		running, finish := make(chan struct{}), make(chan struct{})
		first := make(chan error, 1)
		go func() {
			first <- lock.TryRun(ctx, leader.DSN(r.AppDSN), key, lock.Options{Identity: "first"}, func(context.Context) error {
				close(running)
				<-finish
				return nil
			})
		}()
		select {
		case <-running:
		case err := <-first:
			t.Fatalf("the first TryRun did not run: %v", err)
		}
		err := lock.TryRun(ctx, leader.DSN(r.AppDSN), key, lock.Options{Identity: "second"}, func(context.Context) error {
			t.Error("the second TryRun ran while the first held the lock")
			return nil
		})
		var he *lock.HeldError
		if !errors.As(err, &he) || he.Holder.Identity != "first" {
			t.Errorf("second TryRun: want HeldError naming first, got %v", err)
		}
		h, err := leader.Holder(ctx, app(), key)
		if err != nil || !h.Held || h.Holder.Identity != "first" {
			t.Errorf("Holder on the app role's connection: %+v, %v", h, err)
		}
		close(finish)
		if err := <-first; err != nil {
			t.Errorf("first TryRun: %v", err)
		}
	})

	t.Run("TryTx", func(t *testing.T) {
		a, b := app(), app()
		txa, err := a.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer txa.Rollback(ctx)
		if ok, err := lock.TryTx(ctx, txa, key); !ok || err != nil {
			t.Fatalf("TryTx on a free key: %v, %v", ok, err)
		}
		txb, err := b.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer txb.Rollback(ctx)
		if ok, err := lock.TryTx(ctx, txb, key); ok || err != nil {
			t.Fatalf("TryTx while another transaction holds the key: %v, %v", ok, err)
		}
		txb.Rollback(ctx)
		txc, err := b.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer txc.Rollback(ctx)
		tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		if err := lock.Tx(tctx, txc, key); !errors.Is(err, lock.ErrHeld) {
			t.Fatalf("Tx while another transaction holds the key: want ErrHeld, got %v", err)
		}
	})

	t.Run("GuardPool", func(t *testing.T) {
		cfg, err := pgxpool.ParseConfig(r.AppDSN)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 1
		var leaks atomic.Int32
		lock.GuardPool(cfg, lock.PoolGuard{OnLeak: func(_ *pgx.Conn, n int) { leaks.Add(int32(n)) }})
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		key := leader.KeyFromName(t.Name())
		crashingJob(t, p, key)
		// The next acquire waits for the guard of the only connection.
		c, err := p.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c.Release()
		if leaks.Load() != 1 {
			t.Errorf("the guard saw %d leaked locks, want 1", leaks.Load())
		}
		if h, err := leader.Holder(ctx, conn(t), key); err != nil || h.Held {
			t.Errorf("the leaked lock is still held: %+v %v", h, err)
		}
	})
}
