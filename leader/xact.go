package leader

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/internal/lockconn"
)

// ErrNoDeadline is returned by LockTx for a context without a deadline: a
// blocking lock wait must be bounded.
var ErrNoDeadline = errors.New("pgleader: LockTx needs a context with a deadline")

// ErrInProgress is returned by RunTx when another transaction holds the
// key: the same work is in progress elsewhere.
var ErrInProgress = errors.New("pgleader: in progress elsewhere")

// LockTx takes key for the rest of tx (pg_advisory_xact_lock), waiting at
// most until ctx's deadline; COMMIT or ROLLBACK releases it. The wait is
// bounded on the server with lock_timeout, so a timeout leaves the
// connection healthy; tx is then aborted and must be rolled back, and the
// error matches ErrLockHeld (and, with errors.As, the server's
// *pgconn.PgError). Use PairKey(namespace, id) keys so that different
// workflows on the same entity do not block each other.
//
// For the wait, the transaction's statement_timeout is lifted (a role's
// short statement_timeout would otherwise end the wait early with a bare
// query_canceled error); it and lock_timeout are restored after the lock is
// taken. On a standby it takes nothing and returns ErrStandby. The whole
// call is one round trip.
func LockTx(ctx context.Context, tx pgx.Tx, key Key) error {
	dl, ok := ctx.Deadline()
	if !ok {
		return ErrNoDeadline
	}
	remaining := time.Until(dl)
	if remaining <= 0 {
		return context.DeadlineExceeded
	}
	t := lockconn.TagOf(key)
	b := &pgx.Batch{}
	b.Queue(`SELECT set_config('pgleader.saved_lock_timeout', current_setting('lock_timeout'), true),`+
		`set_config('pgleader.saved_statement_timeout', current_setting('statement_timeout'), true),`+
		`set_config('lock_timeout', $1, true), set_config('statement_timeout', '0', true)`,
		strconv.FormatInt(max(1, remaining.Milliseconds()), 10))
	var standby, locked bool
	b.Queue(`SELECT r, CASE WHEN r THEN false ELSE (SELECT true FROM pg_advisory_xact_lock(`+t.Args+`)) END FROM pg_is_in_recovery() r`, t.Vals...).
		QueryRow(func(row pgx.Row) error { return row.Scan(&standby, &locked) })
	b.Queue(`SELECT set_config('lock_timeout', current_setting('pgleader.saved_lock_timeout'), true),` +
		`set_config('statement_timeout', current_setting('pgleader.saved_statement_timeout'), true)`)
	err := tx.SendBatch(ctx, b).Close()
	if lockconn.IsLockTimeout(err) {
		return fmt.Errorf("%w: waited %s for %s: %w", ErrLockHeld, remaining.Round(time.Millisecond), key, err)
	}
	if err == nil && standby {
		return fmt.Errorf("%w: LockTx took nothing", ErrStandby)
	}
	return err
}

// TryLockTx takes key for the rest of tx if it is free
// (pg_try_advisory_xact_lock) and reports whether it did. It never waits.
// On a standby it takes nothing and returns ErrStandby.
func TryLockTx(ctx context.Context, tx pgx.Tx, key Key) (bool, error) {
	t := lockconn.TagOf(key)
	var standby, ok bool
	err := tx.QueryRow(ctx, `SELECT r, CASE WHEN r THEN false ELSE pg_try_advisory_xact_lock(`+t.Args+`) END FROM pg_is_in_recovery() r`, t.Vals...).Scan(&standby, &ok)
	if err == nil && standby {
		return false, fmt.Errorf("%w: TryLockTx took nothing", ErrStandby)
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
func RunTx(ctx context.Context, db Beginner, key Key, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		ok, err := TryLockTx(ctx, tx, key)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%w: %s", ErrInProgress, key)
		}
		return fn(ctx, tx)
	})
}
