package elector

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/internal/wire/terms"
)

// lease is what the elector needs of its lock session. *lockconn.Lease is
// the real one, on a dedicated PostgreSQL connection; tests script one to
// reach branches a real server rarely takes (a grant that races its
// timeout, a busy or stuck fencing term). It is the core (a tenure's life)
// and the hand-over on demand, apart, so that a fake of the core stays
// small (embed noHandover for the rest).
type lease interface {
	coreLease
	handoverLease
	valueLease
}

// coreLease campaigns, proves, renews and releases.
type coreLease interface {
	PID() uint32
	Campaign(ctx context.Context, t *lockconn.Target, try bool) (lockconn.Round, error)
	Confirm(ctx context.Context, t *lockconn.Target) (term int64, err error)
	Renew(ctx context.Context, t *lockconn.Target) error
	RenewSession(ctx context.Context, t *lockconn.Target) error
	Announce(ctx context.Context, t *lockconn.Target) error
	WaitIdle(ctx context.Context, t *lockconn.Target, until time.Time) (lockconn.Request, error)
	Record(ctx context.Context, sql string, args ...any) error
	Unlock(ctx context.Context, t *lockconn.Target) error
	Close()
}

// handoverLease answers resign requests (see RequestResign): who asked,
// the answer, and the reservation for a named candidate.
type handoverLease interface {
	Requester(ctx context.Context, pid uint32, roles []string) (role string, allowed, found bool, err error)
	Reply(ctx context.Context, pid uint32, msg string) error
	Standing(ctx context.Context, t *lockconn.Target, identity string) (bool, error)
	Precede(ctx context.Context, t *lockconn.Target, to string) (standing, first bool, err error)
	Reserve(ctx context.Context, t *lockconn.Target, to string, within time.Duration) error
	Unreserve(ctx context.Context, t *lockconn.Target, to string, within time.Duration) (string, error)
	DropReservation(ctx context.Context, t *lockconn.Target, to string) error
	SendRank(ctx context.Context, t *lockconn.Target, leaderPID uint32, r lockconn.Rank) error
	ShortenWait(t *lockconn.Target, d time.Duration)
	Candidate(ctx context.Context, t *lockconn.Target, pid uint32) (name string, ok bool, err error)
}

var _ lease = (*lockconn.Lease)(nil)

// openLease connects and sets the session up in one round trip:
// application_name, the lock wait bound (RenewInterval), the server-side
// lease (idle_session_timeout = LeaseDuration), keepalives, and
// synchronous_commit (local: see lockconn.Setup); with fencing it also
// makes sure the terms table exists; then it prepares the quiet follower
// round. Connecting and the rest are each bounded by LeaseDuration.
func (e *Elector) openLease(ctx context.Context) (lease, error) {
	c := e.cfg
	cctx, cancel := context.WithTimeout(ctx, c.LeaseDuration)
	conn, err := c.Connect.Connect(cctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	// The session's setup has a budget of its own: under a storm of
	// connections (a fleet restarting at once on a busy server) a
	// connection that took long must not leave its setup no time, or every
	// member times out and retries together.
	ctx, cancel = context.WithTimeout(ctx, c.LeaseDuration)
	defer cancel()
	ls, err := lockconn.Open(ctx, conn, lockconn.Settings{
		Identity: c.Identity, AppName: c.appName(), LockTimeout: c.RenewInterval, Lease: c.LeaseDuration,
		KeepIdle: c.RenewDeadline,
	})
	if err != nil {
		lockconn.Close(conn)
		return nil, fmt.Errorf("session setup: %w", err)
	}
	// Before anything is locked: no transaction pooler in between.
	if err := ls.Prove(ctx, c.Connect.Connect); err != nil {
		ls.Close()
		return nil, fmt.Errorf("session setup: %w", err)
	}
	if err := e.ensureTables(ctx, ls); err != nil {
		ls.Close()
		return nil, err
	}
	if err := e.ensureValues(ctx, ls); err != nil {
		ls.Close()
		return nil, err
	}
	if err := e.watch(ctx, ls); err != nil {
		ls.Close()
		return nil, fmt.Errorf("session setup: %w", err)
	}
	return ls, nil
}

// ensureTables makes sure, with fencing, that the terms table (and the
// history table, unless NoHistory) exists and is trusted; the history's
// demotions a fault left unwritten are written now.
func (e *Elector) ensureTables(ctx context.Context, ls *lockconn.Lease) error {
	f := e.cfg.Fencing
	if !f.Enabled {
		return nil
	}
	o := terms.EnsureOptions{Create: !f.NoCreate, Schemas: ls.Schemas(), TrustedOwner: f.TrustedOwner}
	tbl, err := terms.Ensure(ctx, ls.Conn(), f.Table, o)
	if err != nil {
		return fmt.Errorf("fencing: %w", err)
	}
	e.termsTable, e.history = tbl, false
	if !f.NoHistory {
		switch h, err := terms.EnsureHistory(ctx, ls.Conn(), f.HistoryTable, o); {
		case err == nil:
			e.historyTable, e.history = h, true
		case errors.Is(err, terms.ErrNoTable) || errors.Is(err, terms.ErrReadOnly):
			// Fencing works without it: say so once per session.
			e.log.Warn("no leadership history: "+err.Error(), zap.String("table", f.HistoryTable))
		default:
			// A fault, a foreign table, or a lock wait the server gave up
			// on: try again with the next session rather than lose this
			// one's rows.
			return fmt.Errorf("fencing: history table: %w", err)
		}
	}
	e.setBump()
	if e.history {
		e.flushDemotion(ls)
	}
	return nil
}

// watch prepares the quiet follower round (lockconn.Lease.Watch), and the
// leader the session sees now.
func (e *Elector) watch(ctx context.Context, ls *lockconn.Lease) error {
	c := e.cfg
	wait := e.heirWait()
	q := lockconn.Quiet{Wait: wait, Spread: e.spread(ls.DeadlockTimeout()), Poll: c.LeaseDuration, Heirs: heirs, Slack: c.RenewDeadline, Lease: c.LeaseDuration,
		VerifyEvery: c.RenewInterval / 4}
	quiet, holder, err := ls.Watch(ctx, e.target, q)
	if err != nil {
		return err
	}
	if quiet {
		wait = max(wait, q.Poll) // a watcher's round lasts up to its poll interval
	} else {
		e.log.Warn("follower rounds cannot use their session function (no TEMP privilege, or a read-only session): each round then reads pg_locks, and ends in a lock_timeout error the server logs")
		wait = 0 // the plain round waits lock_timeout = RenewInterval
	}
	e.roundWait.Store(int64(wait))
	if holder != "" {
		e.setLeader(holder)
		e.leaderPID = ls.WatchedPID()
		e.tellRank(ls, uint32(e.leaderPID))
	}
	return nil
}

// heirs is how many followers of a key queue on its lock; the others
// watch idle (with no idle_session_timeout, as they hold no lock) and poll
// every LeaseDuration (see lockconn.Quiet): when the leader and every heir
// die at once, the next election takes at most that long, no longer than a
// TTL-based elector with the same lease would take for any failover. Two heirs
// keep a handover at the speed of a lock grant even when the first heir
// dies with the leader; only when the leader and both heirs die at once
// does the election wait for a watcher's poll.
const heirs = lockconn.DefaultHeirs

// heirWait is how long an heir's round waits for the lock: heirWaitLeases
// times LeaseDuration, so that an heir between handovers costs the server
// about what a watcher does. A waiter is granted the lock the moment it is
// released, whatever the round length; a new leader ends its heirs' waits
// once it has announced itself (lockconn's wake), and a stopping heir's
// wait is cancelled. Past deadlock_timeout the server runs its deadlock
// detector once per wait (one walk of this lock's few waiters); while the
// server's log_lock_waits is on, which would log each such wait, the
// session function keeps the wait under deadlock_timeout instead (see
// lockconn.Quiet).
func (e *Elector) heirWait() time.Duration {
	return max(heirWaitLeases*e.cfg.LeaseDuration, time.Millisecond)
}

// heirWaitLeases is an heir's wait in LeaseDurations. A round wakes the
// server three times (the call, deadlock_timeout's detector, the
// lock_timeout), where a watcher's poll wakes it once per LeaseDuration.
// Measured on a 2-core VM (docs/benchmarks.md), per backend: an heir
// waiting 6 s cost the server 241 µs of a core a second, one waiting 18 s
// 173 µs, a watcher polling every 6 s 149 µs; and 100 keys × 3 Electors
// cost 3.7–4.75 % of a core with 6 s waits, 2.0–2.6 % with 18 s (the
// leaders' renews alone 1.3–1.9 %). What a longer wait costs in time, it
// costs only where nothing else ends it: a silent network (no answer
// within the wait plus RenewDeadline; the key's other heir and its
// watchers still stand), and a new leader whose role may not signal the
// heir (lockconn's wake), which its heirs then learn of at their round's
// end. Neither touches a handover: the grant ends the wait. A ranked heir
// ends its wait when its rank is due to be told again (see rankDue).
const heirWaitLeases = 3

// spread is how soon watchers refill an heir slot a new leader freed (see
// lockconn.Quiet.Spread): an heir's wait before waits could outlast
// deadlock_timeout, four fifths of it, at most RenewDeadline.
func (e *Elector) spread(deadlock time.Duration) time.Duration {
	w := e.cfg.RenewDeadline
	if deadlock > 0 {
		w = min(w, deadlock*4/5)
	}
	return max(w, time.Millisecond)
}
