package lock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/internal/wire/timing"
	"github.com/pgleader/pgleader/leader"
)

// errLapsed is the cause of fn's context when no check answered within
// the trust window; errAnsweredLate is TryRun's error when the check then
// did answer (the lock held all along, but fn was cancelled).
var (
	errLapsed       = fmt.Errorf("%w: no check answered within the trust window", leader.ErrRenewDeadline)
	errAnsweredLate = fmt.Errorf("%w: a check answered after the trust window closed", leader.ErrRenewDeadline)
)

// Options tune TryRun. The zero value is fine.
type Options struct {
	// Identity is the lock session's application_name, which leader.Holder and
	// the CLI's status show. Default leader.DefaultIdentity().
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
	Observer leader.Observer
}

// TryRun runs fn once while holding key, on a dedicated connection from c,
// if the lock is free (or becomes free within opts.Wait). When another
// session holds it, TryRun does not run fn and returns a *HeldError
// (errors.Is ErrHeld) naming the holder: the "cron job on every replica,
// run once" pattern.
//
// While fn runs, the session checks that its backend still holds the lock
// and watches its socket; when the lock or the connection is lost, fn's
// context is cancelled with the reason as its cause, and TryRun returns an
// error wrapping it (with fn's own error, if any). The lock is released when
// fn returns, fails or panics; a panic is re-raised after the release.
// TryRun returns fn's error otherwise, and leader.ErrTransactionPooling when the
// connection turns out to be behind a transaction-pooling proxy.
func TryRun(ctx context.Context, c leader.Connector, key leader.Key, opts Options, fn func(ctx context.Context) error) (err error) {
	if fn == nil {
		return errors.New("pgleader: TryRun: nil fn")
	}
	ls, err := opts.open(ctx, c, key, "TryRun")
	if err != nil {
		return err
	}
	defer ls.Close()
	target := lockconn.NewTarget(key, "", "", "")
	start := time.Now()
	held, err := acquire(ctx, ls, target, opts.Wait > 0)
	if err != nil {
		return fmt.Errorf("pgleader: TryRun: %w", err)
	}
	opts.Observer.LockWaited(key, time.Since(start), held)
	if !held {
		return heldError(ctx, ls, key, opts.LeaseDuration/2)
	}
	return confirmAndRun(ctx, ls, target, opts, fn)
}

// heldError names key's holder, looked up within limit (a HeldError
// without one when the lookup fails).
func heldError(ctx context.Context, ls *lockconn.Lease, key leader.Key, limit time.Duration) *HeldError {
	he := &HeldError{Key: key}
	hctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	if h, err := leader.Holder(hctx, ls.Conn(), key); err == nil {
		he.Holder = h.Holder
	}
	return he
}

// defaults fills in opts' zero values.
func (opts *Options) defaults() {
	if opts.Identity == "" {
		opts.Identity = leader.DefaultIdentity()
	}
	if opts.CheckInterval == 0 {
		opts.CheckInterval = time.Second
	}
	if opts.LeaseDuration == 0 {
		opts.LeaseDuration = 6 * time.Second
	}
	if opts.Observer == nil {
		opts.Observer = leader.NopObserver{}
	}
}

// open checks key and opts (after defaults) and opens the lock session;
// what names the caller in errors.
func (opts *Options) open(ctx context.Context, c leader.Connector, key leader.Key, what string) (*lockconn.Lease, error) {
	opts.defaults()
	switch {
	case !key.Valid():
		return nil, fmt.Errorf("pgleader: %s: invalid key", what)
	case opts.CheckInterval < time.Millisecond || opts.LeaseDuration <= 2*opts.CheckInterval:
		return nil, fmt.Errorf("pgleader: %s: need CheckInterval >= 1ms and LeaseDuration > 2 x CheckInterval, got %s and %s", what, opts.CheckInterval, opts.LeaseDuration)
	case opts.Wait < 0:
		return nil, fmt.Errorf("pgleader: %s: Wait must not be negative, got %s", what, opts.Wait)
	}
	if err := leader.ConnectorError(c); err != nil {
		return nil, err
	}
	ls, err := openLease(ctx, c, lockconn.Settings{
		Identity: opts.Identity, LockTimeout: max(opts.Wait, time.Millisecond),
		Lease: opts.LeaseDuration, KeepIdle: opts.LeaseDuration / 2,
	})
	if err != nil {
		return nil, fmt.Errorf("pgleader: %s: %w", what, err)
	}
	return ls, nil
}

// confirmAndRun proves the grant with a check (the trust window counts
// from that check's send, not from the acquire's reply), then runs fn
// while holding the lock.
func confirmAndRun(ctx context.Context, ls *lockconn.Lease, target *lockconn.Target, opts Options, fn func(ctx context.Context) error) error {
	deadline := opts.LeaseDuration / 2
	sent := time.Now()
	cctx, cancel := context.WithDeadline(context.Background(), sent.Add(deadline))
	_, err := ls.Confirm(cctx, target)
	cancel()
	if err != nil {
		return fmt.Errorf("pgleader: TryRun: %w", err)
	}
	return runHolding(ctx, ls, target, sent, opts.CheckInterval, deadline, fn)
}

// openLease connects with c and sets the session up as a lock session.
func openLease(ctx context.Context, c leader.Connector, s lockconn.Settings) (*lockconn.Lease, error) {
	conn, err := c.Connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	ls, err := lockconn.Open(ctx, conn, s)
	if err != nil {
		lockconn.Close(conn)
		return nil, fmt.Errorf("session setup: %w", err)
	}
	// Before anything is locked: no transaction pooler in between.
	if err := ls.Prove(ctx, c.Connect); err != nil {
		ls.Close()
		return nil, fmt.Errorf("session setup: %w", err)
	}
	return ls, nil
}

// acquire takes the lock in one campaign round: a wait bounded by the
// session's lock_timeout, or a try. A wait that ended in lock_timeout may
// have raced the grant, so one more round (a try) settles it, adopting a
// lock the session turns out to hold (lockconn.Adopt), as the elector does.
func acquire(ctx context.Context, ls *lockconn.Lease, t *lockconn.Target, wait bool) (bool, error) {
	r, err := ls.Campaign(ctx, t, !wait)
	if err != nil {
		return false, err
	}
	possiblyHeld := false
	if r.Busy && wait {
		possiblyHeld = true
		if r, err = ls.Campaign(ctx, t, true); err != nil {
			return false, err
		}
	}
	return lockconn.Adopt(r, possiblyHeld, ls.PID())
}

// checkWhile checks the lock every interval until fn returns (fnDone).
// lost: the lock is gone, or in doubt with fn returned (the caller closes
// the session); late: a check answered after its window closed, fn was
// cancelled (lapse), and the session went on checking until fn returned.
func checkWhile(ls *lockconn.Lease, t *lockconn.Target, fnDone context.Context, lastOK time.Time,
	interval, deadline time.Duration, lapse func()) (lost, late error) {
	for lost == nil {
		_, werr := ls.WaitIdle(fnDone, t, lastOK.Add(interval))
		if fnDone.Err() != nil {
			break
		}
		if werr != nil {
			return werr, late
		}
		sent := time.Now()
		// The window's end cancels fn; the session stays open until fn
		// returned (timing.Bound).
		cctx, lapsed, cancel := timing.Bound(lastOK.Add(deadline), lapse, fnDone.Done(), 0)
		err := ls.Renew(cctx, t)
		cancel()
		switch {
		case err != nil && lapsed():
			lost = fmt.Errorf("%w (%v)", errLapsed, err) // fn has returned: Bound waited for it
		case err != nil:
			lost = err
		default:
			lastOK = sent
			if lapsed() && late == nil {
				late = errAnsweredLate
			}
		}
	}
	return lost, late
}

// runHolding runs fn while checking the lock, then releases it.
func runHolding(ctx context.Context, ls *lockconn.Lease, t *lockconn.Target, lastOK time.Time,
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
	lost, late := checkWhile(ls, t, fnDone, lastOK, interval, deadline, func() { cancelFn(errLapsed) })
	if lost != nil {
		cancelFn(lost)
		ls.Close() // the lock is gone or in doubt
		<-fnDone.Done()
	} else {
		uctx, cancel := context.WithTimeout(context.Background(), deadline)
		if ls.Unlock(uctx, t) != nil {
			ls.Close()
		}
		cancel()
	}
	if panicked != nil {
		panic(panicked)
	}
	if lost == nil && late != nil {
		lost = late
	}
	if lost != nil {
		if fnErr != nil && !errors.Is(fnErr, context.Canceled) {
			return errors.Join(fmt.Errorf("pgleader: TryRun: lock lost while fn ran: %w", lost), fnErr)
		}
		return fmt.Errorf("pgleader: TryRun: lock lost while fn ran: %w", lost)
	}
	return fnErr
}
