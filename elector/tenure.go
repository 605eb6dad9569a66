package elector

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/internal/wire/terms"
	"github.com/pgleader/pgleader/internal/wire/timing"
	"github.com/pgleader/pgleader/leader"
	"go.uber.org/zap"
)

// tenure is one term of leadership, from the election to OnDemoted.
type tenure struct {
	l      leader.Leadership
	ctx    context.Context // OnElected's; cancelled by stepDown, or by a lapse (renewContext), after IsLeader turned false
	cancel context.CancelCauseFunc
	// stop asks hold to end the tenure: a Resign, OnElected returning, or
	// Run's context ending (its parent). Its cause is the reason.
	stop     context.Context
	stopWith context.CancelCauseFunc
	cbDone   chan struct{} // closed when OnElected returned
	demoted  chan struct{} // closed after OnDemoted
	trust    window
	log      *zap.Logger
	// handoverTo: the candidate the lock is reserved for, which this
	// tenure hands over to when it steps down (a resign request named
	// it, or the leader reserved ahead of a preference handover).
	handoverTo string
	// Values (see Proclaim): the calls waiting for the leader's
	// goroutine, which wake cancels out of its idle read (wakeUp; both
	// guarded by Elector.mu), ended once the tenure takes no more, and
	// unpublished while the leader's value is not written.
	proclaims   []proclaim
	wake        context.Context
	wakeUp      context.CancelFunc
	ended       bool
	unpublished bool
	// unannounced while the leader's announcement has not been sent (a
	// lock table another role filled refused its NOTIFY's commit); it is
	// sent again with a renew at most every announceRetry (announced:
	// the last try).
	unannounced bool
	announced   time.Time
	// cands are the ranks candidates told this leader, by backend pid
	// (see prefer.go); rankRefused, the senders not heard until then.
	cands       map[uint32]*candidate
	rankRefused map[uint32]time.Time
	// sinceProof counts the renews since the last one that read pg_locks
	// (see fullProofEvery).
	sinceProof int
}

// fullProofEvery: one renew in this many (and the tenure's first, which
// announces the leader) proves the lock in pg_locks, whose read copies the
// server's whole lock table (about 1 ms of server CPU at 1,000 locks, so
// that 100 leaders renewing each second spent a tenth of a core on it); the
// others prove the session and the lock with the server's lock manager
// alone (lockconn.Lease.RenewSession). A session lock ends only with its
// session, which the session proof catches at once, or by the session's
// own unlock: RenewSession fails as soon as another session holds the lock
// or waits for it, and the pg_locks proof catches, within this many
// renews, a lock this session lost that nobody took (which leaves no other
// leader meanwhile). docs/how-it-works.md has the argument.
var fullProofEvery = 60

// announceRetry paces the announcements a full lock table refused: each
// failed one is an ERROR in the server's log.
const announceRetry = time.Second

// window is a tenure's trust window. The leader trusts its leadership until
// RenewDeadline after its last successful check was *sent* (not answered:
// the server's lease runs from later than that), and renews RenewInterval
// after it.
type window struct {
	lastOK             time.Time // when the last successful check was sent
	interval, deadline time.Duration
}

// nextRenew is when the next renew is due.
func (w window) nextRenew() time.Time { return w.lastOK.Add(w.interval) }

// closes is when the window closes: the deadline of any check in flight.
func (w window) closes() time.Time { return w.lastOK.Add(w.deadline) }

// tenureKey marks OnElected's context with its tenure.
type tenureKey struct{}

// lead runs one tenure, from the lock being granted to the demotion:
// begin, announce, hold, step down. A grant the campaign round proved
// (proven: the session's own backend took it, in that round trip) needs no
// confirm unless a fencing term must be installed or the round was sent
// so long ago that little of its trust window is left (staleGrant); the
// trust window then runs from when that round was sent. It reports the reason, and whether
// the connection is still fit for use.
func (e *Elector) lead(ctx context.Context, ls lease, sent time.Time, proven bool, waited time.Duration) (reason error, keepConn bool) {
	vsent, term, err := sent, int64(0), error(nil)
	if !proven || e.cfg.Fencing.Enabled || e.staleGrant(sent) {
		vsent, term, err = e.confirm(ctx, ls)
	}
	switch {
	case errors.Is(err, errTermStuck):
		e.log.Error("could not install the next fencing term: a transaction of an earlier leader holds the term row; releasing the lock and campaigning again. Set idle_in_transaction_session_timeout on the connections that call Fence.",
			zap.String("table", e.cfg.Fencing.Table))
		return err, e.unlock(ls) == nil
	case errors.Is(err, errTermTableFull):
		e.log.Error("could not install the next fencing term: the server's lock table stayed full (another role may hold most of it: see pg_locks); releasing the lock and campaigning again",
			zap.String("table", e.cfg.Fencing.Table), zap.Error(err))
		return err, e.unlock(ls) == nil
	}
	if err != nil {
		return err, false
	}
	t := e.begin(ctx, ls.PID(), term, vsent, waited)
	// The first renew announces the new leader to the followers: after
	// OnElected started, as the notification wakes every one of them.
	if reason = e.renew(t, ls, true, true); reason == nil {
		if reason = e.publish(t, ls); reason == nil {
			reason = e.hold(t, ls)
		}
	}
	return e.stepDown(ctx, ls, t, reason)
}

// begin starts a tenure: it opens the trust window, starts OnElected, and
// only then reports the election (log lines, OnNewLeader's dispatch, the
// Observer), so that nothing of the user's runs between the lock check and
// OnElected, and no log write delays it.
func (e *Elector) begin(ctx context.Context, pid uint32, term int64, vsent time.Time, waited time.Duration) *tenure {
	c := e.cfg
	l := leader.Leadership{Key: c.Key, Identity: c.Identity, Term: term, ElectedAt: time.Now(), BackendPID: pid}
	if c.Fencing.Enabled {
		l.TermsTable = e.termsTable.Raw(c.Fencing.Table)
	}
	t := &tenure{l: l, demoted: make(chan struct{}), cbDone: make(chan struct{}),
		trust: window{lastOK: vsent, interval: c.RenewInterval, deadline: c.RenewDeadline},
		cands: map[uint32]*candidate{}, rankRefused: map[uint32]time.Time{}}
	// The marker lets Resign know a call made with OnElected's own context.
	// OnElected's context keeps Run's values but not its cancellation: it
	// ends only in stepDown, once IsLeader is false, whatever the reason.
	leadCtx, cancel := context.WithCancelCause(context.WithValue(context.WithoutCancel(ctx), tenureKey{}, t))
	t.ctx, t.cancel = leadCtx, cancel
	t.stop, t.stopWith = context.WithCancelCause(ctx)
	t.wake, t.wakeUp = context.WithCancel(t.stop)
	t.log = e.log.With(zap.Int64("term", term), zap.Uint32("backend_pid", pid))
	e.trustUntil.Store(int64(t.trust.closes().Sub(e.epoch)))
	e.leading.Store(true)
	e.mu.Lock()
	e.tenure, e.cbDone = t, t.cbDone
	e.mu.Unlock()
	// Status() and Leader() describe the tenure inside OnElected;
	// OnNewLeader itself runs on its own goroutine, so nothing of the
	// user's runs here.
	e.note(func(st *Status) {
		st.Term, st.Since, st.LastRenew, st.LastRound, st.LastError = term, l.ElectedAt, vsent, time.Now(), ""
		st.Candidates, st.Why = nil, "first come"
	})
	newLeader, changed := e.storeLeader(c.Identity)
	e.leaderPID, e.valuePID = 0, 0
	go func() {
		defer close(t.cbDone)
		defer func() {
			// Returning because its context ended is not returning on
			// its own: the context's cause (a resign, a fault) stays the
			// reason, whichever signal reached the loop first.
			cause := error(leader.ErrCallbackReturned)
			if leadCtx.Err() != nil {
				cause = context.Cause(leadCtx)
			}
			t.stopWith(cause)
		}()
		c.Callbacks.OnElected(leadCtx, l)
	}()
	// Let OnElected run first: the rest (the log line, the Observer, the
	// announcing renew) can wait for it, the leader's work should not
	// wait for them.
	runtime.Gosched()
	if changed {
		e.reportLeader(newLeader)
	}
	e.electedOnce.Do(func() { close(e.elected) })
	// acquire_wait: from the start of the campaign (its first round) to the
	// grant, as pgleader_acquire_wait_seconds.
	t.log.Info("elected", zap.Duration("acquire_wait", waited))
	e.obs.Elected(l)
	return t
}

// hold keeps the tenure: it renews on the RenewInterval schedule and reads
// the idle socket in between, so that a terminated backend's FATAL message
// or EOF ends the tenure at once. It returns the reason the tenure ends:
// the cause of the tenure's stop signal (a resign, OnElected returning, Run's
// context) or a fault.
func (e *Elector) hold(t *tenure, ls lease) error {
	for {
		e.mu.Lock()
		wake := t.wake
		e.mu.Unlock()
		until := t.trust.nextRenew()
		if c, at := e.preferredAt(t); c != nil {
			if c.name != "" && !c.ahead {
				at = at.Add(-e.aheadOf())
			}
			if at.Before(until) {
				until = at
			}
		}
		req, werr := ls.WaitIdle(wake, e.target, until)
		switch {
		case t.stop.Err() != nil:
			e.leaving(t, ls)
			return context.Cause(t.stop)
		case wake.Err() != nil: // a Proclaim
			if err := e.proclaimed(t, ls); err != nil {
				return err
			}
			continue
		case werr != nil:
			return werr
		case req.Rank != nil:
			e.heardRank(t, req)
		case req.PID != 0:
			if reason := e.request(t, ls, req); reason != nil {
				return reason
			}
		}
		if reason := e.prefer(t, ls); reason != nil {
			return lapsedHandover(t, reason)
		}
		if time.Now().Before(t.trust.nextRenew()) {
			continue
		}
		again := t.unannounced && time.Since(t.announced) >= announceRetry
		if err := e.renew(t, ls, true, again); err != nil {
			return err
		}
		if t.unpublished {
			if err := e.publish(t, ls); err != nil {
				return err
			}
		}
	}
}

// request answers a resign request (see RequestResign): it returns the
// reason to step down when the request is granted, nil to keep leading.
// With a named candidate it first reserves the lock for it (see
// lockconn.Lease.Reserve); stepDown releases the reservation once the
// candidate holds the lock. A trust window that closes under its
// statements ends the tenure with ErrRenewDeadline, as under a renew.
func (e *Elector) request(t *tenure, ls lease, req lockconn.Request) error {
	now := time.Now()
	if n := e.requests.report(now); n > 0 {
		t.log.Warn("resign requests dropped or refused without a log line (a flood of them: see docs/security.md)", zap.Int64("count", n))
	}
	if !e.requests.admit(req.PID, now) {
		return nil
	}
	ctx, lapsed, cancel := e.renewContext(t)
	reason := e.decide(ctx, t, ls, req, now)
	cut := ctx.Err() != nil
	cancel()
	if lapsed() {
		// The window closed under the request's statements: the tenure
		// ends for that, whatever the request decided. The bound cuts
		// their I/O (which closes the session) only once OnElected
		// returned; a session not cut drains as after a late renew
		// (stepDown; one lost on its own fails the drain's first renew).
		if cut {
			return fmt.Errorf("%w (a resign request's statements were cut)", errLapsed)
		}
		return errAnsweredLate
	}
	return reason
}

// decide answers a resign request that passed the admission, on ctx.
func (e *Elector) decide(ctx context.Context, t *tenure, ls lease, req lockconn.Request, now time.Time) error {
	c := e.cfg
	log := t.log.With(zap.Uint32("asker_pid", req.PID), zap.String("to", req.To))
	answer := func(msg string) {
		if err := ls.Reply(ctx, req.PID, msg); err != nil {
			log.Warn("could not answer a resign request", zap.Error(err))
		}
	}
	refuse := func(msg string, fields ...zap.Field) {
		if e.requests.refuse(req.PID, now, c.RenewInterval) {
			log.Warn("resign request refused: "+msg, fields...)
		}
	}
	if c.ResignRequests.Disabled {
		refuse("this elector takes none (ResignRequests.Disabled)")
		answer("refused: " + c.Identity + " takes no resign requests")
		return nil
	}
	role, allowed, found, err := ls.Requester(ctx, req.PID, c.ResignRequests.Roles)
	switch {
	case err != nil:
		log.Warn("could not read who asked to resign", zap.Error(err))
		return nil
	case !found:
		refuse("the asker's session is gone")
		return nil
	case !allowed:
		refuse("role not allowed", zap.String("role", role))
		answer(fmt.Sprintf("refused: role %q may not ask %s to resign (a superuser, a member of its role, or of ResignRequests.Roles may)", role, c.Identity))
		return nil
	}
	log = log.With(zap.String("role", role))
	why := fmt.Sprintf("requested by role %s (pid %d)", role, req.PID)
	if req.To != "" {
		msg, ok := e.reserveFor(ctx, t, ls, req.To, log)
		if !ok {
			answer(msg)
			return nil
		}
		why = "handover to " + req.To + " " + why
	}
	log.Info("resign request granted")
	answer("ok")
	return fmt.Errorf("%w: %s", leader.ErrResigned, why)
}

// reserveFor reserves the lock for the named candidate to (see
// lockconn.Lease.Reserve) before a granted request's step-down; when it
// cannot, it returns the answer to the asker and false.
func (e *Elector) reserveFor(ctx context.Context, t *tenure, ls lease, to string, log *zap.Logger) (string, bool) {
	c := e.cfg
	if to == c.Identity {
		return "refused: " + c.Identity + " already leads", false
	}
	if ok, err := ls.Standing(ctx, e.target, to); err != nil || !ok {
		log.Info("resign request refused: no such candidate", zap.Error(err))
		return fmt.Sprintf("unknown: %q does not stand for this key", to), false
	}
	switch t.handoverTo {
	case to: // reserved ahead of a preference handover to it
		return "", true
	case "":
	default:
		if err := e.dropAhead(t, ls); err != nil {
			log.Warn("handover not started: could not release the reservation made for another candidate", zap.Error(err))
			return "failed: " + err.Error(), false
		}
	}
	return e.reserve(ctx, t, ls, to, log)
}

// reserve reserves the lock for the candidate to, which stands for the
// key; when it cannot, it returns why and false.
func (e *Elector) reserve(ctx context.Context, t *tenure, ls lease, to string, log *zap.Logger) (string, bool) {
	c := e.cfg
	// The named candidate queues within milliseconds of the reservation's
	// announcement (a watcher, a few more: it hears the announcement,
	// then queues). No renew runs meanwhile, and ctx bounds every
	// statement on the leader's connection (one it cuts short closes the
	// connection, and the lock with it, under a leader that is still
	// draining): wait while both the trust window and ctx leave half a
	// RenewDeadline, for the last look and the release, and at least a
	// renew interval (a loaded machine's watcher may take that long), at
	// most handoverQueueWait.
	left := time.Until(t.trust.closes())
	if d, ok := ctx.Deadline(); ok {
		left = min(left, time.Until(d))
	}
	within := min(handoverQueueWait, max(c.RenewInterval, left-c.RenewDeadline/2))
	if err := ls.Reserve(ctx, e.target, to, within); err != nil {
		log.Warn("handover not started: could not reserve the lock for the named candidate", zap.Error(err))
		return "failed: " + err.Error(), false
	}
	t.handoverTo = to
	return "", true
}

// handoverQueueWait bounds how long a leader waits for a named candidate to
// queue on the lock, and then for it to take the lock after the unlock.
const handoverQueueWait = 2 * time.Second

// renew proves that this session's backend still holds the lock (with
// announce, it also announces the leader; see lockconn.Lease.Announce).
// The check must answer within the trust window, RenewDeadline from when
// the last successful renew was sent; a successful one moves the window to
// its own send time. While leading (not draining) it also extends IsLeader.
func (e *Elector) renew(t *tenure, ls lease, leading, announce bool) error {
	rsent := time.Now()
	rctx, lapsed, cancel := e.renewContext(t)
	var err error
	switch {
	case announce:
		err = e.announce(rctx, t, ls) // with pg_locks
		t.sinceProof = 0
	case t.sinceProof+1 >= fullProofEvery:
		err = ls.Renew(rctx, e.target)
		t.sinceProof = 0
	default:
		err = ls.RenewSession(rctx, e.target)
		t.sinceProof++
	}
	cancel()
	switch {
	case err != nil && lapsed():
		return fmt.Errorf("%w (%v)", errLapsed, err) // the lapse's cancel, not a lost connection
	case err != nil:
		return err
	}
	t.trust.lastOK = rsent
	if lapsed() {
		if leading {
			// The window closed first: the tenure is over, but the
			// session lives and holds the lock (stepDown drains).
			return errAnsweredLate
		}
		// Draining: OnElected's context is already cancelled; the renew
		// kept the session, and the lock, alive, which is all it is for.
		t.log.Debug("a renew answered after the trust window closed, while draining", zap.Duration("latency", time.Since(rsent)))
		return nil
	}
	if leading {
		e.trustUntil.Store(int64(t.trust.closes().Sub(e.epoch)))
	}
	latency := time.Since(rsent)
	e.note(func(st *Status) { st.LastRenew, st.LastRound = rsent, time.Now() })
	e.obs.Renewed(t.l, latency)
	t.log.Debug("renewed", zap.Duration("latency", latency), zap.Bool("draining", !leading))
	return nil
}

// announce is a renew that also announces the leader (see
// lockconn.Lease.Announce). When a lock table another role filled refused
// the announcement, the check in front of it still proved the lock: the
// renew succeeds and the announcement is sent again later (followers
// still find the leader by their own lookups).
func (e *Elector) announce(ctx context.Context, t *tenure, ls lease) error {
	t.announced = time.Now()
	err := ls.Announce(ctx, e.target)
	switch {
	case err == nil:
		t.unannounced = false
	case errors.Is(err, lockconn.ErrLockTableFull):
		if !t.unannounced {
			t.log.Warn("the server's lock table is full: this leader's announcement was not sent; trying again every second", zap.Error(err))
		}
		t.unannounced = true
		return nil
	}
	return err
}

// errReleaseTimeout: OnElected did not return within ReleaseTimeout.
var errReleaseTimeout = errors.New("OnElected did not return within ReleaseTimeout")

// release ends a graceful step-down: it drains (keeps the lock, renewed,
// until OnElected returns, or ReleaseTimeout), unlocks, and releases a
// reservation for a named candidate. It reports whether the session is fit
// for use, or the fault that ended the drain (the step-down is then a
// fault's).
func (e *Elector) release(t *tenure, ls lease, releaseAt time.Time, reason error) (keepConn bool, fault error) {
	switch fault := e.drain(t, ls, releaseAt, reason); {
	case fault == nil:
		keepConn = e.unlock(ls) == nil
		if keepConn && t.handoverTo != "" {
			keepConn = e.unreserve(t, ls)
		}
		return keepConn, nil
	case errors.Is(fault, errReleaseTimeout):
		t.log.Error("OnElected did not return within ReleaseTimeout after its context was cancelled; releasing the lock while it still runs, so two leaders may act at once",
			zap.Duration("release_timeout", e.cfg.ReleaseTimeout))
		return e.unlock(ls) == nil, nil
	case errors.Is(fault, leader.ErrRenewDeadline):
		// Not lost, in doubt: the session stays open until OnElected
		// returned (renewContext, stepDown).
		t.log.Warn("the trust window closed while OnElected was returning (a renew not answered in time); the session is closed once it returned",
			zap.NamedError("resign_reason", reason), zap.Error(fault))
		return false, fault
	default:
		t.log.Error("the lock was lost while OnElected was returning; another leader may act before it returns",
			zap.NamedError("resign_reason", reason), zap.Error(fault))
		return false, fault
	}
}

// stepDown ends a tenure: stop trusting, cancel OnElected, then either
// drain (a graceful step-down: keep the lock, renewed, until OnElected
// returns) and unlock, or (a fault: the lock is gone or in doubt) close the
// session at once and wait for OnElected. A renew answered after the
// trust window closed (the session alive, the lock held) drains as a
// graceful step-down does. OnDemoted comes last.
func (e *Elector) stepDown(ctx context.Context, ls lease, t *tenure, reason error) (error, bool) {
	c := e.cfg
	releaseAt := time.Now().Add(c.ReleaseTimeout)
	e.leading.Store(false)
	e.trustUntil.Store(0)
	e.endProclaims(t)
	t.cancel(reason)
	t.stopWith(reason)
	e.obs.Demoted(t.l, reason)
	// A renew answered after the window closed is not graceful, but the
	// session lives and holds the lock: it drains like a graceful
	// step-down (the renews keep the server-side lease from freeing the
	// lock), so that no candidate leads before OnElected returned.
	graceful := errors.Is(reason, leader.ErrResigned) || errors.Is(reason, leader.ErrCallbackReturned) || ctx.Err() != nil ||
		errors.Is(reason, errAnsweredLate)
	keepConn := false
	if graceful {
		var fault error
		if keepConn, fault = e.release(t, ls, releaseAt, reason); fault != nil {
			reason, graceful = fault, false
		}
	}
	if !graceful {
		ls.Close() // the lock is gone or in doubt: end the session now
		e.note(func(st *Status) { st.LastError = reason.Error() })
		t.log.Warn("stepping down", zap.NamedError("reason", reason))
		if !timing.WaitUntil(t.cbDone, releaseAt) {
			t.log.Error("OnElected did not return within ReleaseTimeout after its context was cancelled",
				zap.Duration("release_timeout", c.ReleaseTimeout))
		}
	} else if !keepConn {
		ls.Close()
	}
	e.setLeaderIfSelf()
	if errors.Is(reason, errAnsweredLate) {
		e.note(func(st *Status) { st.LastError = reason.Error() })
		t.log.Warn("demoted", zap.NamedError("reason", reason)) // a fault, drained
	} else if graceful {
		t.log.Info("demoted", zap.NamedError("reason", reason))
	} else {
		t.log.Warn("demoted", zap.NamedError("reason", reason)) // a fault, not a choice
	}
	if c.Callbacks.OnDemoted != nil {
		c.Callbacks.OnDemoted(t.l, reason)
	}
	if e.history && t.l.Term > 0 {
		e.pendingDemotion = &demotion{term: t.l.Term, at: time.Now(), reason: leader.ReasonLabel(reason), detail: reason.Error()}
		if keepConn {
			e.flushDemotion(ls)
		}
	}
	e.mu.Lock()
	e.tenure = nil
	e.mu.Unlock()
	close(t.demoted)
	return reason, keepConn
}

// drain keeps a stepping-down leader's session alive and its lock checked
// on the renew schedule while OnElected returns, so that the server-side
// lease never frees the lock under a callback that is still running. It
// returns nil when OnElected returned, errReleaseTimeout at releaseAt, or
// the fault that lost the lock or the connection. It logs the step-down's
// reason when it has to wait (OnElected still running 2 ms after its
// context was cancelled).
func (e *Elector) drain(t *tenure, ls lease, releaseAt time.Time, reason error) error {
	// Most callbacks return within microseconds of their context's
	// cancel (most often before the loop got here): wait for that briefly
	// before reading the socket, whose interruption costs a handover more
	// than the wait does. Nothing else runs on a handover's path until
	// then: no log line, no goroutine.
	select {
	case <-t.cbDone:
		return nil
	default:
	}
	if timing.WaitUntil(t.cbDone, time.Now().Add(2*time.Millisecond)) {
		return nil
	}
	t.log.Info("stepping down: waiting for OnElected to return, renewing meanwhile", zap.NamedError("reason", reason))
	dctx, cancel := context.WithDeadline(context.Background(), releaseAt)
	defer cancel()
	go func() {
		select {
		case <-t.cbDone:
			cancel()
		case <-dctx.Done():
		}
	}()
	for {
		select {
		case <-t.cbDone:
			return nil
		default:
		}
		_, werr := ls.WaitIdle(dctx, e.target, t.trust.nextRenew())
		select {
		case <-t.cbDone:
			return nil
		default:
		}
		switch {
		case dctx.Err() != nil:
			return errReleaseTimeout
		case werr != nil:
			return werr
		}
		if err := e.renew(t, ls, false, false); err != nil {
			return err
		}
	}
}

func (e *Elector) setLeaderIfSelf() {
	if e.Leader() == e.cfg.Identity {
		empty := ""
		e.leaderID.Store(&empty)
	}
}

// unreserve waits for the named candidate to take the lock, then releases
// the reservation; it reports whether the connection is still fit for use.
func (e *Elector) unreserve(t *tenure, ls lease) bool {
	ctx, cancel := context.WithTimeout(context.Background(), handoverQueueWait+e.cfg.RenewDeadline)
	defer cancel()
	app, err := ls.Unreserve(ctx, e.target, t.handoverTo, handoverQueueWait)
	holder := identity(app)
	switch {
	case err != nil:
		t.log.Warn("could not release the handover's reservation; closing the connection", zap.Error(err))
		return false
	case holder != t.handoverTo:
		t.log.Warn("handover: the named candidate did not take the lock", zap.String("to", t.handoverTo), zap.String("holder", holder))
	default:
		t.log.Info("handed over", zap.String("to", holder))
	}
	return true
}

// unlock releases the lock once. It fails when the lock was not held, which
// would mean the session state is not what the elector believes.
func (e *Elector) unlock(ls lease) error {
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.RenewDeadline)
	defer cancel()
	err := ls.Unlock(ctx, e.target)
	if err != nil {
		e.log.Warn("unlock failed; closing the connection to release the lock", zap.Error(err))
	}
	return err
}

// waitCallback waits for the last OnElected to return, logging an error
// every ReleaseTimeout, and returns ctx's error when ctx ends first.
func (e *Elector) waitCallback(ctx context.Context) error {
	e.mu.Lock()
	done := e.cbDone
	e.mu.Unlock()
	if done == nil {
		return nil
	}
	for {
		t := time.NewTimer(max(e.cfg.ReleaseTimeout, time.Second))
		select {
		case <-done:
			t.Stop()
			return nil
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
			e.log.Error("still waiting for a previous OnElected to return; it ignores its context")
		}
	}
}

// demotion is the end of a term, for the history table.
type demotion struct {
	term           int64
	at             time.Time
	reason, detail string
}

// flushDemotion records the pending end of a term in the history table;
// after a failure the next session tries again (meanwhile the next term's
// election marks it "superseded").
func (e *Elector) flushDemotion(ls lease) {
	d := e.pendingDemotion
	if d == nil || !e.history {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.RenewDeadline)
	defer cancel()
	classid, objid, objsubid := e.cfg.Key.LockTag()
	if err := ls.Record(ctx, terms.DemotedSQL(e.historyTable.Quoted()), classid, objid, objsubid, d.term, d.at, d.reason, d.detail); err != nil {
		e.log.Warn("could not record the end of a term in the history table", zap.Int64("term", d.term), zap.Error(err))
		return
	}
	e.pendingDemotion = nil
}

// setBump picks the statement that installs a term: with or without its
// history row.
func (e *Elector) setBump() {
	q := e.termsTable.Quoted()
	if e.history {
		e.target.SetBump(terms.BumpHistorySQL(q, e.historyTable.Quoted(), e.cfg.Fencing.HistoryRetention))
		return
	}
	e.target.SetBump(terms.BumpSQL(q))
}
