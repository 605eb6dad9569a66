package elector

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/internal/wire/terms"
	"github.com/pgleader/pgleader/leader"
	"go.uber.org/zap"
)

// connectAndServe opens a lease, campaigns and leads on it until it breaks
// or ctx ends, and closes it. It reports how long the session served.
func (e *Elector) connectAndServe(ctx context.Context) (time.Duration, error) {
	ls, err := e.open(ctx)
	if err != nil {
		return 0, err
	}
	defer ls.Close()
	e.log.Info("connected", zap.Uint32("backend_pid", ls.PID()))
	e.note(func(st *Status) { st.Connected, st.LastRound, st.LastError = true, time.Now(), "" })
	began := time.Now()
	err = e.serve(ctx, ls)
	return time.Since(began), err
}

// serve alternates campaigns and tenures on one session.
func (e *Elector) serve(ctx context.Context, ls lease) error {
	coolDown, possiblyHeld := false, false
	var campaignStart time.Time
	for {
		if err := ctx.Err(); err != nil {
			return err // an heir's round does not end with ctx (see lockconn.Quiet)
		}
		if err := e.waitCallback(ctx); err != nil {
			return err
		}
		if coolDown {
			// Give a waiting candidate the lock we just released.
			coolDown = false
			t := time.NewTimer(e.cfg.RenewInterval)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
		}
		if campaignStart.IsZero() {
			campaignStart = time.Now()
			e.log.Info("campaigning")
			e.obs.Campaigning(e.cfg.Key, e.cfg.Identity)
		}
		won, proven, sent, err := e.campaign(ctx, ls, &possiblyHeld)
		if err != nil {
			return err
		}
		e.note(func(st *Status) { st.LastRound = time.Now() })
		if !won {
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err() // won while stopping: closing the session frees the lock
		}
		waited := time.Since(campaignStart) // the log and the metric say the same
		e.obs.LockWaited(e.cfg.Key, waited, true)
		campaignStart = time.Time{}
		reason, keepConn := e.lead(ctx, ls, sent, proven, waited)
		if !keepConn {
			return reason
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		coolDown = true
	}
}

// campaign runs one campaign round (see lockconn.Lease.Campaign), in one
// round trip. On a quiet session an heir waits for the lock for
// followerWait, and a watcher waits idle for a notification or its next
// poll (at most LeaseDuration), then polls; both learn the leader from
// notifications, and a lock they take is proven this session's in the
// same round trip. The plain round looks up the holder and waits for at
// most RenewInterval (lock_timeout). A round that ends busy leaves the
// lock possibly held: the grant can race the timeout, and the next round
// adopts a lock it finds held (lockconn.Adopt).
//
// The round has a client-side deadline: its lock wait plus RenewDeadline.
// A proxy that keeps the socket open but forwards nothing ends the round
// there with ErrConnectionLost, and Run reconnects.
func (e *Elector) campaign(ctx context.Context, ls lease, possiblyHeld *bool) (won, proven bool, sent time.Time, err error) {
	sent = time.Now()
	wait := max(e.cfg.RenewInterval, time.Duration(e.roundWait.Load()))
	e.waitForRank(ls)
	rctx, cancel := context.WithDeadline(ctx, sent.Add(wait+e.cfg.RenewDeadline))
	defer cancel()
	r, err := ls.Campaign(rctx, e.target, false)
	if err != nil {
		if rctx.Err() == context.DeadlineExceeded && !errors.Is(err, leader.ErrConnectionLost) {
			err = fmt.Errorf("%w: no answer to a campaign round within its lock wait plus RenewDeadline (%s): %w",
				leader.ErrConnectionLost, wait+e.cfg.RenewDeadline, err)
		}
		return false, false, sent, err
	}
	switch {
	case r.Free, r.Holder == "" && r.HolderPID != 0 && r.HolderPID != e.leaderPID:
		// Nobody leads, or a session with no name holds the lock (not an
		// elector this one can name): no leader, and no callback for that.
		e.leaderID.Store(new(string))
		e.leaderPID = 0
	case r.Holder != "":
		e.setLeader(r.Holder)
		e.leaderPID = r.HolderPID
	}
	if r.Woken {
		// A new leader's announcement (or a reservation) woke this heir: a
		// rank told since it looked the leader up may have reached the
		// leader before it listened. Tell it again.
		e.rankTo = 0
	}
	if !r.Held {
		// A round that won leads now: a rank told to the last leader
		// would only delay OnElected by a round trip.
		e.tellRank(ls, uint32(e.leaderPID))
	}
	// Left alone: a round that saw the known leader's backend without a
	// name (not seen in tests yet; the chaos run's "pid N" leader was a
	// nameless holder of some kind): that backend is still that leader.

	// With values on, the leader's value, when the round says it may
	// have changed (see followValue).
	if err := e.followValue(ls, r); err != nil {
		return false, false, sent, err
	}
	if r.Busy && !r.Held {
		e.log.Debug("lock busy; campaigning again", zap.String("holder", r.Holder))
		*possiblyHeld = true
		return false, false, sent, nil
	}
	won, err = lockconn.Adopt(r, *possiblyHeld, ls.PID())
	if err == nil && r.Already {
		e.log.Info("the last lock wait timed out as the lock was granted; holding it")
	}
	*possiblyHeld = false
	if !r.Sent.IsZero() {
		sent = r.Sent // a watcher's round waited idle before its poll
	}
	return won, won && r.Proven, sent, err
}

// errTermStuck: the lock is ours, but the next term could not be installed
// within LeaseDuration because an earlier leader's fenced transaction holds
// the term row.
var errTermStuck = errors.New("fencing term row locked by an earlier leader's transaction")

// errTermTableFull: the lock is ours, but the next term could not be
// installed within LeaseDuration because the server's lock table stayed
// full (another role may have filled it): the term's transaction needs a
// slot for its transaction id.
var errTermTableFull = errors.New("the server's lock table stayed full")

// confirm proves, right after the lock was granted, that our own backend
// holds it (which also catches a transaction-pooling proxy), and with
// fencing installs the next term in the same round trip. While the term
// row is busy it tries again, for up to LeaseDuration. So it does, every
// RenewInterval, while the server's lock table is full (SQLSTATE 53200:
// the term's transaction finds no slot for its transaction id, and is
// rolled back; the session and its lock are fine): ending the session
// there would let another role that fills the table make the fleet's
// electors drop the lock and reconnect, one after another. It returns when
// the successful check was sent, and the term.
//
// Nothing acts on the lock before confirm returns (OnElected has not
// started), so each check's own send time anchors the trust window, and
// its deadline is that plus RenewDeadline: the server's lease runs from
// after the check, whatever happened before it.
func (e *Elector) confirm(ctx context.Context, ls lease) (time.Time, int64, error) {
	giveUp := time.Now().Add(e.cfg.LeaseDuration)
	for {
		vsent := time.Now()
		cctx, cancel := context.WithDeadline(context.Background(), vsent.Add(e.cfg.RenewDeadline))
		term, err := ls.Confirm(cctx, e.target)
		cancel()
		full := lockconn.IsLockTableFull(err)
		if !full && !errors.Is(err, lockconn.ErrTermBusy) {
			return vsent, term, e.classifyConfirm(err)
		}
		if time.Now().After(giveUp) {
			if full {
				return vsent, 0, fmt.Errorf("%w: %w", errTermTableFull, err)
			}
			return vsent, 0, errTermStuck
		}
		if full {
			e.log.Debug("the lock table is full: the term waits", zap.Error(err))
			select {
			case <-ctx.Done(): // Run's end: the session closes, and the lock goes with it
				return vsent, 0, ctx.Err()
			case <-time.After(min(e.cfg.RenewInterval, time.Until(giveUp))):
			}
		}
	}
}

// staleGrant reports whether a proven grant needs a confirm all the same:
// the trust window it opened (from its round's send time or, for an
// heir's wait, from about its grant: lockconn's grantedFrom) began so long
// ago (an answer that came late, a loaded machine) that less than half of
// it is left.
// OnElected would start with little or no trust left, and the first
// renew's deadline would pass in flight, demoting a leader that holds the
// lock. A check now opens a fresh window, before OnElected.
func (e *Elector) staleGrant(sent time.Time) bool {
	return time.Since(sent) > e.cfg.RenewDeadline/2
}

// classifyConfirm names a failed term installation: the server's refusals
// (a missing table, a privilege, a read-only session) through terms.Classify,
// anything else on the wire as a lost connection.
func (e *Elector) classifyConfirm(err error) error {
	var pgErr *pgconn.PgError
	switch {
	case err == nil || errors.Is(err, leader.ErrConnectionLost) || errors.Is(err, leader.ErrRenewDeadline) ||
		errors.Is(err, leader.ErrTransactionPooling) || errors.Is(err, leader.ErrStandby) || errors.Is(err, leader.ErrLockLost):
		return err
	case errors.As(err, &pgErr):
		return fmt.Errorf("install term: %w", terms.Classify(err, e.cfg.Fencing.Table))
	default:
		return fmt.Errorf("%w: install term: %w", leader.ErrConnectionLost, err)
	}
}
