package lock

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/leader"
)

// Tx takes key for the rest of tx (pg_advisory_xact_lock), waiting at
// most until ctx's deadline; COMMIT or ROLLBACK releases it. The wait is
// bounded on the server with lock_timeout, so a timeout leaves the
// connection healthy; tx is then aborted and must be rolled back, and the
// error matches ErrHeld (and, with errors.As, the server's
// *pgconn.PgError). Use PairKey(namespace, id) keys so that different
// workflows on the same entity do not block each other.
//
// For the wait, the transaction's statement_timeout is lifted (a role's
// short statement_timeout would otherwise end the wait early with a bare
// query_canceled error); it and lock_timeout are restored after the lock is
// taken. On a standby it takes nothing and returns leader.ErrStandby. The whole
// call is one round trip.
func Tx(ctx context.Context, tx pgx.Tx, key leader.Key) error {
	dl, ok := ctx.Deadline()
	if !ok {
		return ErrNoDeadline
	}
	remaining := time.Until(dl)
	if remaining <= 0 {
		return context.DeadlineExceeded
	}
	// The server's lock_timeout ends the wait a little before the
	// client's deadline would, so that a timeout reads as ErrHeld on a
	// healthy connection rather than as a cancelled, closed one.
	wait := max(time.Millisecond, remaining-min(100*time.Millisecond, remaining/4))
	t := lockconn.TagOf(key)
	b := &pgx.Batch{}
	// These statements run in the caller's transaction, under the caller's
	// search_path: every function names pg_catalog (see leader.Holder).
	b.Queue(`SELECT pg_catalog.set_config('pgleader.saved_lock_timeout', pg_catalog.current_setting('lock_timeout'), true),`+
		`pg_catalog.set_config('pgleader.saved_statement_timeout', pg_catalog.current_setting('statement_timeout'), true),`+
		`pg_catalog.set_config('lock_timeout', $1, true), pg_catalog.set_config('statement_timeout', '0', true)`,
		strconv.FormatInt(max(1, wait.Milliseconds()), 10))
	var standby, locked bool
	b.Queue(`SELECT r, CASE WHEN r THEN false ELSE (SELECT true FROM pg_catalog.pg_advisory_xact_lock(`+t.Args+`)) END FROM pg_catalog.pg_is_in_recovery() r`, t.Vals...).
		QueryRow(func(row pgx.Row) error { return row.Scan(&standby, &locked) })
	b.Queue(`SELECT pg_catalog.set_config('lock_timeout', pg_catalog.current_setting('pgleader.saved_lock_timeout'), true),` +
		`pg_catalog.set_config('statement_timeout', pg_catalog.current_setting('pgleader.saved_statement_timeout'), true)`)
	err := tx.SendBatch(ctx, b).Close()
	if lockconn.IsLockTimeout(err) {
		return fmt.Errorf("%w: waited %s for %s: %w", ErrHeld, wait.Round(time.Millisecond), key, err)
	}
	if err == nil && standby {
		return fmt.Errorf("%w: lock.Tx took nothing", leader.ErrStandby)
	}
	return err
}

// TryTx takes key for the rest of tx if it is free
// (pg_try_advisory_xact_lock) and reports whether it did. It never waits.
// On a standby it takes nothing and returns leader.ErrStandby.
func TryTx(ctx context.Context, tx pgx.Tx, key leader.Key) (bool, error) {
	t := lockconn.TagOf(key)
	var standby, ok bool
	err := tx.QueryRow(ctx, `SELECT r, CASE WHEN r THEN false ELSE pg_catalog.pg_try_advisory_xact_lock(`+t.Args+`) END FROM pg_catalog.pg_is_in_recovery() r`, t.Vals...).Scan(&standby, &ok)
	if err == nil && standby {
		return false, fmt.Errorf("%w: lock.TryTx took nothing", leader.ErrStandby)
	}
	return ok, err
}

// Beginner starts transactions: *pgx.Conn and *pgxpool.Pool satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// RunTx is the idempotency pattern: it begins a transaction on db, takes key
// for it if free, runs fn, and commits. When another transaction holds key
// it returns ErrInProgress at once without running fn, so a duplicate
// webhook delivery can answer "in progress" (HTTP 409 or 425). fn should
// first check whether the work was already done (for example a processed
// row for the event id), since the lock only serialises: after the first
// transaction commits, the next one runs. An error from fn rolls back.
func RunTx(ctx context.Context, db Beginner, key leader.Key, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		ok, err := TryTx(ctx, tx, key)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%w: %s", ErrInProgress, key)
		}
		return fn(ctx, tx)
	})
}
