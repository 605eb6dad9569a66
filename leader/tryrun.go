package leader

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/internal/lockconn"
)

// ErrLockHeld is matched (errors.Is) by a *HeldError: the lock is held by
// another session, so the work was skipped.
var ErrLockHeld = errors.New("pgleader: lock held by another session")

// HeldError reports that a key was held by someone else.
type HeldError struct {
	Key Key
	// Holder is the session holding the key as seen right after the
	// attempt (zero when it was released in between).
	Holder Session
}

// Error names the key and, when known, its holder.
func (e *HeldError) Error() string {
	if e.Holder.PID == 0 {
		return fmt.Sprintf("pgleader: lock %s held by another session", e.Key)
	}
	who := e.Holder.Identity
	if who == "" {
		who = "a session"
	}
	return fmt.Sprintf("pgleader: lock %s held by %s (pid %d, user %s)", e.Key, who, e.Holder.PID, e.Holder.User)
}

// Unwrap makes errors.Is(err, ErrLockHeld) true.
func (e *HeldError) Unwrap() error { return ErrLockHeld }

// DefaultIdentity is "hostname-pid", cut to the 63 bytes PostgreSQL keeps
// of an application_name.
func DefaultIdentity() string {
	host, _ := os.Hostname()
	suffix := fmt.Sprintf("-%d", os.Getpid())
	if len(host)+len(suffix) > 63 {
		host = host[:63-len(suffix)]
	}
	return host + suffix
}

// RunOptions tune TryRun. The zero value is fine.
type RunOptions struct {
	// Identity is the lock session's application_name, which Holder and
	// the CLI's status show. Default DefaultIdentity().
	Identity string
	// Wait is how long to wait for a held lock. Zero: skip at once.
	Wait time.Duration
	// CheckInterval is how often the session checks, while fn runs, that it
	// still holds the lock. Default 1s.
	CheckInterval time.Duration
	// LeaseDuration is the server-side lease (idle_session_timeout,
	// PostgreSQL 14+): a paused or partitioned process loses the lock this
	// long after its last check. fn's context is cancelled when no check
	// has succeeded for half of it. Default 6s; it must exceed
	// 2 x CheckInterval.
	LeaseDuration time.Duration
	// Observer receives the lock wait.
	Observer Observer
}

// TryRun runs fn once while holding key, on a dedicated connection from c,
// if the lock is free (or becomes free within opts.Wait). When another
// session holds it, TryRun does not run fn and returns a *HeldError
// (errors.Is ErrLockHeld) naming the holder: the "cron job on every replica,
// run once" pattern.
//
// While fn runs, the session checks that its backend still holds the lock
// and watches its socket; when the lock or the connection is lost, fn's
// context is cancelled with the reason as its cause, and TryRun returns an
// error wrapping it (with fn's own error, if any). The lock is released when
// fn returns, fails or panics; a panic is re-raised after the release.
// TryRun returns fn's error otherwise, and ErrTransactionPooling when the
// connection turns out to be behind a transaction-pooling proxy.
func TryRun(ctx context.Context, c Connector, key Key, opts RunOptions, fn func(ctx context.Context) error) (err error) {
	if opts.Identity == "" {
		opts.Identity = DefaultIdentity()
	}
	if opts.CheckInterval == 0 {
		opts.CheckInterval = time.Second
	}
	if opts.LeaseDuration == 0 {
		opts.LeaseDuration = 6 * time.Second
	}
	if opts.Observer == nil {
		opts.Observer = NopObserver{}
	}
	switch {
	case !key.Valid():
		return errors.New("pgleader: TryRun: invalid key")
	case fn == nil:
		return errors.New("pgleader: TryRun: nil fn")
	case opts.CheckInterval < time.Millisecond || opts.LeaseDuration <= 2*opts.CheckInterval:
		return fmt.Errorf("pgleader: TryRun: need CheckInterval >= 1ms and LeaseDuration > 2 x CheckInterval, got %s and %s", opts.CheckInterval, opts.LeaseDuration)
	case opts.Wait < 0:
		return fmt.Errorf("pgleader: TryRun: Wait must not be negative, got %s", opts.Wait)
	}
	if err := ConnectorError(c); err != nil {
		return err
	}
	conn, err := c.Connect(ctx)
	if err != nil {
		return fmt.Errorf("pgleader: TryRun: connect: %w", err)
	}
	defer lockconn.Close(conn)
	deadline := opts.LeaseDuration / 2
	sess, err := lockconn.Setup(ctx, conn, lockconn.Settings{
		Identity: opts.Identity, LockTimeout: max(opts.Wait, time.Millisecond),
		Lease: opts.LeaseDuration, KeepIdle: deadline,
	})
	if err != nil {
		return fmt.Errorf("pgleader: TryRun: session setup: %w", err)
	}
	tag := lockconn.TagOf(key)
	fnName := "pg_try_advisory_lock"
	if opts.Wait > 0 {
		fnName = "pg_advisory_lock"
	}
	start := time.Now()
	r, err := lockconn.ScanAcquire(conn.QueryRow(ctx, tag.AcquireSQL(fnName), append([]any{pgx.QueryExecModeExec}, tag.Vals...)...))
	held := r.Held
	switch {
	case lockconn.IsLockTimeout(err):
		// The wait timed out, but a grant can race the timeout and leave
		// the session holding the lock: ask.
		held = lockconn.Check(ctx, conn, tag, sess) == nil
	case err != nil:
		return fmt.Errorf("pgleader: TryRun: %w", lockconn.Pooling(err))
	default:
		if err := sess.Same(r.PID, r.Token); err != nil {
			return err
		}
		if r.Already {
			return fmt.Errorf("%w: this session's backend (pid %d) already held the lock", ErrTransactionPooling, r.PID)
		}
	}
	wait := time.Since(start)
	opts.Observer.LockWaited(key, wait, held)
	if !held {
		he := &HeldError{Key: key}
		if h, herr := Holder(ctx, conn, key); herr == nil {
			he.Holder = h.Holder
		}
		return he
	}

	sent := time.Now()
	cctx, cancel := context.WithDeadline(context.Background(), sent.Add(deadline))
	err = lockconn.Check(cctx, conn, tag, sess)
	cancel()
	if errors.Is(err, ErrLockLost) {
		err = fmt.Errorf("%w: the lock just taken is missing from pg_locks", ErrTransactionPooling)
	}
	if err != nil {
		return fmt.Errorf("pgleader: TryRun: %w", err)
	}
	return runHolding(ctx, conn, tag, sess, sent, opts.CheckInterval, deadline, fn)
}

// runHolding runs fn while checking the lock, then releases it.
func runHolding(ctx context.Context, conn *pgx.Conn, tag lockconn.Tag, sess lockconn.Session, lastOK time.Time,
	interval, deadline time.Duration, fn func(ctx context.Context) error) error {
	fnCtx, cancelFn := context.WithCancelCause(ctx)
	defer cancelFn(nil)
	fnDone, stopWatch := context.WithCancel(context.Background())
	var fnErr error
	var panicked any
	go func() {
		defer stopWatch()
		defer func() { panicked = recover() }()
		fnErr = fn(fnCtx)
	}()
	var lost error
	for lost == nil {
		werr := lockconn.WaitIdle(fnDone, conn, lastOK.Add(interval))
		if fnDone.Err() != nil {
			break
		}
		if werr != nil {
			lost = werr
			break
		}
		sent := time.Now()
		cctx, cancel := context.WithDeadline(context.Background(), lastOK.Add(deadline))
		lost = lockconn.Check(cctx, conn, tag, sess)
		cancel()
		if lost == nil {
			lastOK = sent
		}
	}
	if lost != nil {
		cancelFn(lost)
		lockconn.Close(conn) // the lock is gone or in doubt
		<-fnDone.Done()
	} else {
		uctx, cancel := context.WithTimeout(context.Background(), deadline)
		if lockconn.Unlock(uctx, conn, tag) != nil {
			lockconn.Close(conn)
		}
		cancel()
	}
	if panicked != nil {
		panic(panicked)
	}
	if lost != nil {
		if fnErr != nil && !errors.Is(fnErr, context.Canceled) {
			return errors.Join(fmt.Errorf("pgleader: TryRun: lock lost while fn ran: %w", lost), fnErr)
		}
		return fmt.Errorf("pgleader: TryRun: lock lost while fn ran: %w", lost)
	}
	return fnErr
}
