package lock_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgleader/pgleader/leader"
	"github.com/pgleader/pgleader/lock"
)

func guardedPool(t testing.TB, g lock.PoolGuard) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(server(t).DSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	lock.GuardPool(cfg, g)
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// crashingJob takes a session lock on a pooled connection and "crashes"
// before unlocking: the connection goes back to the pool holding it.
func crashingJob(t *testing.T, p *pgxpool.Pool, key leader.Key) (pid uint32) {
	t.Helper()
	ctx := context.Background()
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	args, vals := key.SQLArgs(1)
	if err := c.QueryRow(ctx, "SELECT pg_catalog.pg_backend_pid() FROM pg_catalog.pg_advisory_lock("+args+")", vals...).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() { recover() }()
		panic("job crashed between lock and unlock")
	}()
	return pid
}

func TestPoolGuard(t *testing.T) {
	for _, mode := range []lock.GuardMode{lock.GuardUnlock, lock.GuardDestroy, lock.GuardUnlockBlind} {
		name := map[lock.GuardMode]string{lock.GuardUnlock: "unlock", lock.GuardDestroy: "destroy", lock.GuardUnlockBlind: "blind"}[mode]
		destroy := mode == lock.GuardDestroy
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			var leaks atomic.Int32
			p := guardedPool(t, lock.PoolGuard{Mode: mode, OnLeak: func(_ *pgx.Conn, n int) { leaks.Add(int32(n)) }})
			key := leader.KeyFromName(t.Name())
			leakedPid := crashingJob(t, p, key)
			// The next user of the pool must not hold the lock.
			c, err := p.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Release()
			var pid uint32
			var held int
			if err := c.QueryRow(ctx, "SELECT pg_backend_pid(), (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid())").Scan(&pid, &held); err != nil {
				t.Fatal(err)
			}
			if held != 0 {
				t.Fatalf("reused connection holds %d advisory locks", held)
			}
			if destroy == (pid == leakedPid) {
				t.Fatalf("destroy=%v but the backend pid went from %d to %d", destroy, leakedPid, pid)
			}
			admin := conn(t)
			if destroy {
				// The pool closed the leaked connection; its backend
				// frees the lock as it exits, a moment later (on a loaded
				// machine, after the next Acquire): wait for that exit.
				waitGone(t, admin, leakedPid)
			}
			h, err := leader.Holder(ctx, admin, key)
			if err != nil || h.Held {
				t.Fatalf("the leaked lock is still held: %+v %v", h, err)
			}
			if want := map[bool]int32{true: 0, false: 1}[mode == lock.GuardUnlockBlind]; leaks.Load() != want {
				t.Fatalf("OnLeak saw %d locks, want %d", leaks.Load(), want)
			}
		})
	}
}

// waitGone waits, up to 30 s, until the backend pid has exited.
func waitGone(t *testing.T, admin *pgx.Conn, pid uint32) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := admin.QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", int32(pid)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("backend %d still runs 30 s after its connection was closed", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The cost of the guard per acquire/release cycle, against a plain pool.
//
//	go test -run '^$' -bench PoolAcquireRelease ./leader/
func BenchmarkPoolAcquireRelease(b *testing.B) {
	for _, query := range []bool{false, true} {
		for _, mode := range []string{"plain", "guard-unlock", "guard-destroy", "guard-blind"} {
			name := mode
			if query {
				name += "+select1"
			}
			b.Run(name, func(b *testing.B) { benchPool(b, mode, query) })
		}
	}
}

func benchPool(b *testing.B, mode string, query bool) {
	{
		{
			cfg, err := pgxpool.ParseConfig(server(b).DSN())
			if err != nil {
				b.Fatal(err)
			}
			cfg.MaxConns = 1
			if m, ok := map[string]lock.GuardMode{"guard-unlock": lock.GuardUnlock,
				"guard-destroy": lock.GuardDestroy, "guard-blind": lock.GuardUnlockBlind}[mode]; ok {
				lock.GuardPool(cfg, lock.PoolGuard{Mode: m})
			}
			p, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			ctx := context.Background()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				c, err := p.Acquire(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if query {
					if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
						b.Fatal(err)
					}
				}
				c.Release()
			}
		}
	}
}

// The application's own AfterRelease hook, installed before GuardPool,
// still decides: a connection it vetoes is destroyed, and the guard does
// not run on it.
func TestPoolGuardKeepsTheApplicationsVeto(t *testing.T) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(server(t).DSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	var vetoed, leaks atomic.Int32
	cfg.AfterRelease = func(*pgx.Conn) bool { vetoed.Add(1); return false }
	lock.GuardPool(cfg, lock.PoolGuard{OnLeak: func(*pgx.Conn, int) { leaks.Add(1) }})
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	first := crashingJob(t, p, leader.KeyFromName(t.Name()))
	var second uint32
	if err := p.QueryRow(ctx, "SELECT pg_catalog.pg_backend_pid()").Scan(&second); err != nil {
		t.Fatal(err)
	}
	if second == first || vetoed.Load() == 0 || leaks.Load() != 0 {
		t.Fatalf("the application's veto: backends %d then %d, %d vetoes, %d leaks seen by the guard; want a new backend, the veto, and no guard run", first, second, vetoed.Load(), leaks.Load())
	}
}
