package lock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgleader/pgleader/leader"
	"github.com/pgleader/pgleader/lock"
)

func pool(t testing.TB, max int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(server(t).DSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = max
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// The entity lock serialises a read-modify-write: no lost updates.
func TestLockTxSerialisesReadModifyWrite(t *testing.T) {
	p := pool(t, 10)
	ctx := context.Background()
	if _, err := p.Exec(ctx, `CREATE TABLE IF NOT EXISTS counters (id int PRIMARY KEY, n int NOT NULL); INSERT INTO counters VALUES (7, 0) ON CONFLICT (id) DO UPDATE SET n = 0`); err != nil {
		t.Fatal(err)
	}
	const workers, each = 8, 25
	const confirm = 1
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				lctx, cancel := context.WithTimeout(ctx, waitLong)
				err := pgx.BeginFunc(lctx, p, func(tx pgx.Tx) error {
					if err := lock.Tx(lctx, tx, leader.PairKey(confirm, 7)); err != nil {
						return err
					}
					var n int
					if err := tx.QueryRow(lctx, `SELECT n FROM counters WHERE id = 7`).Scan(&n); err != nil {
						return err
					}
					_, err := tx.Exec(lctx, `UPDATE counters SET n = $1 WHERE id = 7`, n+1)
					return err
				})
				cancel()
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	var n int
	if err := p.QueryRow(ctx, `SELECT n FROM counters WHERE id = 7`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != workers*each {
		t.Fatalf("counter %d, want %d: lost updates", n, workers*each)
	}
}

// Namespaces keep workflows apart; a bounded wait ends cleanly and leaves
// the connection healthy with its lock_timeout restored.
func TestLockTxNamespacesAndTimeouts(t *testing.T) {
	p := pool(t, 4)
	ctx := context.Background()
	const confirm, refund = 1, 2
	holder, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if ok, err := lock.TryTx(ctx, holder, leader.PairKey(confirm, 7)); err != nil || !ok {
		t.Fatalf("TryLockTx on a free key: %v %v", ok, err)
	}

	// "refund order 7" does not wait for "confirm order 7".
	other, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Exec(ctx, "SET LOCAL lock_timeout = '4321ms'"); err != nil {
		t.Fatal(err)
	}
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	if err := lock.Tx(lctx, other, leader.PairKey(refund, 7)); err != nil {
		t.Fatalf("other namespace blocked: %v", err)
	}
	cancel()
	var lt string
	if err := other.QueryRow(ctx, "SHOW lock_timeout").Scan(&lt); err != nil || lt != "4321ms" {
		t.Fatalf("lock_timeout not restored: %q %v", lt, err)
	}
	if ok, err := lock.TryTx(ctx, other, leader.PairKey(confirm, 7)); err != nil || ok {
		t.Fatalf("TryLockTx on a held key: %v %v", ok, err)
	}
	other.Rollback(ctx)

	// A blocking wait without a deadline is refused; with one it ends as
	// ErrLockHeld, on the server, leaving the connection usable.
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := lock.Tx(ctx, tx, leader.PairKey(confirm, 7)); !errors.Is(err, lock.ErrNoDeadline) {
		t.Fatalf("no deadline: %v", err)
	}
	// The server's wait ends 100 ms before the deadline (a quarter of it,
	// for shorter ones): a 200 ms deadline left 50 ms for the timeout's
	// answer, which a loaded machine overran.
	lctx, cancel = context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := lock.Tx(lctx, tx, leader.PairKey(confirm, 7)); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("held key: want ErrLockHeld, got %v", err)
	}
	tx.Rollback(ctx)
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("connection unusable after a lock timeout: %v", err)
	}
}

// Idempotency: duplicates that arrive together get ErrInProgress; after the
// first commits, the next one runs (and sees the work done).
func TestRunTxIdempotency(t *testing.T) {
	p := pool(t, 4)
	ctx := context.Background()
	if _, err := p.Exec(ctx, `CREATE TABLE IF NOT EXISTS processed (event_id int PRIMARY KEY); DELETE FROM processed WHERE event_id = 1001`); err != nil {
		t.Fatal(err)
	}
	const webhooks = 3
	key := leader.PairKey(webhooks, 1001)
	handle := func(inside func()) (string, error) {
		outcome := ""
		err := lock.RunTx(ctx, p, key, func(ctx context.Context, tx pgx.Tx) error {
			var done bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM processed WHERE event_id = 1001)`).Scan(&done); err != nil {
				return err
			}
			if done {
				outcome = "duplicate"
				return nil
			}
			inside()
			outcome = "processed"
			_, err := tx.Exec(ctx, `INSERT INTO processed VALUES (1001)`)
			return err
		})
		return outcome, err
	}
	inFirst := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	letGo := func() { once.Do(func() { close(release) }) }
	// A failing test still lets the first transaction end, so that the
	// pool's Close (a cleanup registered earlier, run later) returns.
	t.Cleanup(letGo)
	first := make(chan error, 1)
	go func() {
		_, err := handle(func() { close(inFirst); <-release })
		first <- err
	}()
	waitFor(t, inFirst, "the first transaction")
	for i := 0; i < 3; i++ {
		if _, err := handle(func() {}); !errors.Is(err, lock.ErrInProgress) {
			t.Fatalf("concurrent duplicate: want ErrInProgress, got %v", err)
		}
	}
	letGo()
	if err := waitFor(t, first, "the first transaction"); err != nil {
		t.Fatal(err)
	}
	if out, err := handle(func() {}); err != nil || out != "duplicate" {
		t.Fatalf("after the first committed: %q %v", out, err)
	}
}

// A role's short statement_timeout does not cut LockTx's wait short: the
// wait lasts until the context's deadline and then reads as ErrLockHeld,
// with the server's lock_timeout error in the chain; the role's
// statement_timeout is back in force afterwards.
func TestLockTxOverridesStatementTimeout(t *testing.T) {
	srv := server(t)
	ctx := context.Background()
	for _, sql := range []string{
		"DROP ROLE IF EXISTS impatient",
		"CREATE ROLE impatient LOGIN",
		"ALTER ROLE impatient SET statement_timeout = '200ms'",
	} {
		if err := srv.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	key := leader.KeyFromName(t.Name())
	holder, err := srv.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(ctx)
	id, _ := key.Int64()
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_lock($1::int8)", id); err != nil {
		t.Fatal(err)
	}
	dsn := "postgres://impatient@" + srv.Addr() + "/postgres?sslmode=disable"
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	const wait = time.Second
	var took time.Duration
	var tx pgx.Tx
	// The server's lock_timeout ends the wait 100 ms before the caller's
	// deadline; a machine that stalls the answer longer than that (CI's
	// matrix beside it) gives the caller's deadline instead, which is no
	// fault of Tx's: try again, three times at most. A lock_timeout at or
	// past the deadline, or a statement_timeout not overridden, fails every
	// try.
	for try := 1; ; try++ {
		if tx, err = conn.Begin(ctx); err != nil {
			t.Fatal(err)
		}
		lctx, cancel := context.WithTimeout(ctx, wait)
		began := time.Now()
		err = lock.Tx(lctx, tx, key)
		took = time.Since(began)
		cancel()
		tx.Rollback(ctx)
		if !errors.Is(err, context.DeadlineExceeded) || try == 3 {
			break
		}
		t.Logf("try %d: the answer came after the caller's deadline (%s): %v", try, took, err)
		if conn.IsClosed() {
			if conn, err = pgx.Connect(ctx, dsn); err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
		}
	}
	var pgErr *pgconn.PgError
	if !errors.Is(err, lock.ErrHeld) || !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("LockTx: %v; want ErrLockHeld with the server's 55P03", err)
	}
	if took < wait*3/4 {
		t.Fatalf("LockTx gave up after %s, before its deadline of %s", took, wait)
	}
	var st string
	if err := conn.QueryRow(ctx, "SHOW statement_timeout").Scan(&st); err != nil || st != "200ms" {
		t.Fatalf("statement_timeout after LockTx: %q, %v", st, err)
	}

	// Taken: the role's statement_timeout is restored inside the transaction.
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_unlock($1::int8)", id); err != nil {
		t.Fatal(err)
	}
	tx, err = conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	lctx2, cancel2 := context.WithTimeout(ctx, wait)
	defer cancel2()
	if err := lock.Tx(lctx2, tx, key); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, "SHOW statement_timeout").Scan(&st); err != nil || st != "200ms" {
		t.Fatalf("statement_timeout inside the transaction after LockTx: %q, %v", st, err)
	}
}

// What the transaction-scoped locks leave on a pooled connection after
// COMMIT: nothing. No advisory lock of the session's (another session can
// take the key at once), and the session's lock_timeout and
// statement_timeout as they were; inside the transaction, after Tx, the
// caller's own settings again.
func TestTxLeavesNothingBehind(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, server(t).DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	other, err := pgx.Connect(ctx, server(t).DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	if _, err := conn.Exec(ctx, "SET lock_timeout = '1234ms'; SET statement_timeout = '56789ms'"); err != nil {
		t.Fatal(err)
	}
	settings := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) string {
		var lt, st string
		if err := q.QueryRow(ctx, "SELECT current_setting('lock_timeout'), current_setting('statement_timeout')").Scan(&lt, &st); err != nil {
			t.Fatal(err)
		}
		return lt + " " + st
	}
	free := func(key leader.Key) bool {
		args, vals := key.SQLArgs(1)
		var ok bool
		if err := other.QueryRow(ctx, "SELECT pg_try_advisory_lock("+args+")", vals...).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		if ok {
			if _, err := other.Exec(ctx, "SELECT pg_advisory_unlock("+args+")", vals...); err != nil {
				t.Fatal(err)
			}
		}
		return ok
	}
	lctx, cancel := context.WithTimeout(ctx, waitLong)
	defer cancel()
	for _, c := range []struct {
		name string
		take func(tx pgx.Tx, key leader.Key) error
	}{
		{"Tx", func(tx pgx.Tx, key leader.Key) error { return lock.Tx(lctx, tx, key) }},
		{"TryTx", func(tx pgx.Tx, key leader.Key) error {
			ok, err := lock.TryTx(lctx, tx, key)
			if err == nil && !ok {
				err = errors.New("not taken")
			}
			return err
		}},
	} {
		key := leader.KeyFromName(t.Name() + "/" + c.name)
		err := pgx.BeginFunc(lctx, conn, func(tx pgx.Tx) error {
			if err := c.take(tx, key); err != nil {
				return err
			}
			if got := settings(tx); got != "1234ms 56789ms" {
				t.Errorf("%s: inside the transaction, after it, lock_timeout and statement_timeout are %s, want the caller's 1234ms 56789ms", c.name, got)
			}
			if free(key) {
				t.Errorf("%s: another session took the key inside the transaction", c.name)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := settings(conn); got != "1234ms 56789ms" {
			t.Errorf("%s: after COMMIT the session's lock_timeout and statement_timeout are %s, want 1234ms 56789ms", c.name, got)
		}
		if !free(key) {
			t.Errorf("%s: the key is still held after COMMIT (a session lock)", c.name)
		}
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()").Scan(&n); err != nil || n != 0 {
			t.Errorf("%s: %d advisory locks left on the connection after COMMIT (%v)", c.name, n, err)
		}
	}
	// RunTx: the duplicate is refused while the first runs, and nothing is
	// left after it commits.
	key := leader.KeyFromName(t.Name() + "/RunTx")
	err = lock.RunTx(lctx, conn, key, func(ctx context.Context, tx pgx.Tx) error {
		dup := lock.RunTx(ctx, other, key, func(context.Context, pgx.Tx) error {
			t.Error("RunTx ran a duplicate while the first held the key")
			return nil
		})
		if !errors.Is(dup, lock.ErrInProgress) {
			t.Errorf("duplicate RunTx: %v, want ErrInProgress", dup)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !free(key) {
		t.Error("RunTx: the key is still held after COMMIT")
	}
}
