package lockconn

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The quiet follower. A plain lock wait that ends in lock_timeout is an
// ERROR the server logs with its statement; a holder lookup reads
// pg_locks, which copies the whole lock table under every partition lock;
// a wait longer than deadlock_timeout runs the deadlock detector, which
// takes every partition lock too and walks every waiter of the lock. A
// standing fleet paid all three every second, so the server's cost grew
// with the square of the fleet. A quiet session instead splits the
// followers of a key in two:
//
//   - Heirs, at most Quiet.Heirs of them, queue on the lock itself, so that
//     a release or a crash hands it over at once, as before. A follower is
//     an heir while it holds one of the key's heir slots: advisory locks in
//     a space of pgleader's own (classid Space), taken with
//     pg_try_advisory_lock, which never waits. An heir's round is
//     pgleader_wait below: a lock wait kept under deadlock_timeout that
//     catches lock_not_available, which the server does not log.
//   - Every other follower is a watcher: it sits idle, LISTENing on the
//     key's channel (a new leader announces itself there), and every Poll
//     calls pgleader_poll, which takes the lock if it is free and
//     otherwise a free heir slot, without waiting. An idle session costs
//     the server nothing; a poll costs about what a renew does, and reads
//     pg_locks only when the lock is free or this backend's.
//
// So the lock's wait queue stays a few sessions long whatever the fleet's
// size, and a follower's cost per second does not grow with it. A slot
// frees when its heir wins (the winning round releases it) or its session
// ends; a watcher takes it at its next poll. When the leader and every heir
// die at once, a watcher takes the free lock at its next poll: that
// election takes up to Poll instead of a few milliseconds. A leader that
// steps down while no heir queues (both were used up by quick successive
// handovers) announces the vacancy with an empty NOTIFY in its unlock
// statement, and the watchers poll at once.
//
// Every quiet session also holds its key's roster lock in share mode (in
// the same space; it never conflicts with anything, as nobody takes it
// exclusively), so that pg_locks still lists every standing candidate,
// heir or watcher, for pgleader status.
//
// Both functions live in the session's own pg_temp (which needs only the
// TEMP privilege every role has by default), and both:
//
//   - refuse a server in recovery (4: ErrStandby);
//   - check that they run on the session's own backend, with its token
//     (5: ErrTransactionPooling). A lock they report taken (1) is therefore
//     proven held by this session's backend in the round trip that took it:
//     no separate check is needed before OnElected;
//   - never stack: a probe with a shared lock, taken with
//     pg_try_advisory_lock_shared and released at once, is false while
//     another session holds the lock (the usual case, and no pg_locks
//     read); when it is true the lock is free or this backend's, and only
//     then pg_locks is read for this backend (3: held before the round,
//     which the caller takes for a grant that raced the last round's
//     timeout, or for a shared backend). The probe must not outlive itself:
//     followers that kept a shared lock into their exclusive wait would
//     block each other (the lock-upgrade deadlock).
//
// pgleader_wait settles a grant that raced its timeout the same way: the
// probe, then pg_locks only when the lock is free or ours (1: won; 0:
// busy). On a win it releases the heir slot it held. pgleader_poll answers
// 1 (won), 3 (held before), 0 (busy, no slot free) or 10+i (heir slot i is
// now this session's).
//
// When the functions cannot be created (no TEMP privilege, a read-only
// session), the session keeps the plain round: every follower queues on
// the lock, looks the holder up in pg_locks, and ends its rounds in a
// lock_timeout error the server logs.

// quietFuncs creates the quiet functions (sql/quiet.sql) and the check of
// a reservation they call when they win (sql/handover.sql).
var quietFuncs = statement("quiet", "functions") + "\n" + statement("handover", "functions")

// The quiet functions' answers.
const (
	codeBusy     = 0  // the lock is held by another session
	codeWon      = 1  // this round took the lock
	codeHeld     = 3  // held by this backend before the round
	codeStandby  = 4  // the server is in recovery
	codeForeign  = 5  // another backend, or this one without the session's token
	codeReserved = 6  // won, and given back to a reservation
	codeWoken    = 7  // busy: the wait was cancelled (a new leader's wake)
	codeSlot     = 10 // codeSlot+i: heir slot i is now this session's
)

// DefaultHeirs is the elector's number of heirs per key.
const DefaultHeirs = 2

// Quiet configures a session's quiet campaign for one key.
type Quiet struct {
	// Wait is an heir's lock wait per round. Past the server's
	// deadlock_timeout the server runs its deadlock detector once per
	// wait; while log_lock_waits is on the session function cuts the wait
	// to four fifths of deadlock_timeout, as each longer wait would be
	// logged.
	Wait time.Duration
	// Spread bounds how soon a watcher polls to refill the heir slot a new
	// leader freed, and how often a vacancy hint from a pid not proven the
	// leader's makes it poll (default: Wait, at most 800 ms).
	Spread time.Duration
	// Poll is a watcher's poll interval (each poll comes after 3/4 to all
	// of it, at random, so that a fleet started together spreads out).
	Poll time.Duration
	// Heirs is how many followers queue on the lock; the rest watch.
	Heirs int
	// Slack is how long past its Wait an heir's round may take before the
	// client gives up on it (a silent network): its client-side deadline
	// is Wait plus Slack, whatever the caller's context says (default 2 s).
	Slack time.Duration
	// Lease is the session's idle_session_timeout while it holds a lock
	// (the lock or an heir slot). A watcher holds none and runs without
	// it, so that its polls can be rare; the poll that takes a lock or a
	// slot turns it back on in the same statement, and Unlock turns it
	// off again.
	Lease time.Duration
	// VerifyEvery bounds how often a notification (which any role can
	// send) makes the session look the holder up: at most one lookup per
	// VerifyEvery, and after each lookup that finds the holder it knew
	// (the notification was false) the bound doubles, up to eight times
	// VerifyEvery. Default 250 ms.
	VerifyEvery time.Duration
}

// Channel is the NOTIFY channel of a lock: a new leader announces its
// identity there.
func (t *Target) Channel() string {
	return fmt.Sprintf("pgleader.%d.%d.%d", t.ClassID, t.ObjID, t.ObjSubID)
}

// The calls of a round: the key as pg_locks shows it, the session's pid
// and token, then the round's own arguments. The wait is a procedure: it
// answers its code and, for a grant, how long its wait took as the server
// measured it; and a cancel request (the client stopping, a new leader's
// wake) that lands anywhere in the statement is caught inside it (see
// sql/quiet.sql: a function called by SELECT leaves a check after it
// returns, where a cancel is an ERROR in the server's log).
const (
	waitCall = "CALL pg_temp.pgleader_wait($1::oid, $2::oid, $3::int2, $4::int4, $5::text, $6::int4, $7::int4, $8::int4, $9::int4, NULL, NULL)"
	pollCall = "SELECT pg_temp.pgleader_poll($1::oid, $2::oid, $3::int2, $4::int4, $5::text, $6::int4[], $7::int4, $8::int4, $9::int4)"
)

// newFollower is the quiet campaign for t of the candidate identity.
func newFollower(t *Target, q Quiet, identity string) *follower {
	if q.VerifyEvery <= 0 {
		q.VerifyEvery = VerifyEvery
	}
	if q.Slack <= 0 {
		q.Slack = defaultSlack
	}
	if q.Spread <= 0 {
		q.Spread = min(q.Wait, defaultSpread)
	}
	f := &follower{Quiet: q, heir: -1, verifyGap: q.VerifyEvery, waitSQL: t.mark + waitCall, pollSQL: t.mark + pollCall,
		gate: t.Gate(), me: t.NameLock(identity)}
	for i := range q.Heirs {
		f.slots = append(f.slots, t.Slot(i))
	}
	return f
}

// Watch prepares the session to campaign quietly for t: it creates the
// functions (the first time in the session), takes t's roster lock in
// share mode and listens on t's channel and its reservations' channel, in
// one round trip, and reports whether the quiet campaign is on. In a second
// round trip it returns the holder seen now (one pg_locks read per
// connection), for Leader() before the first notification. When the
// server will never create the functions (no TEMP privilege, a read-only
// session: see lasting) the session keeps the plain round, and that is no
// error; a refusal that may pass is Watch's error, and the next call tries
// again. Call it once per session and target. A follower does not
// listen for resign requests (a flood of them would wake it for nothing);
// a leader does, from its first renew (Announce) to its unlock.
func (l *Lease) Watch(ctx context.Context, t *Target, q Quiet) (quiet bool, holder string, err error) {
	join := "LISTEN " + pgx.Identifier{t.Channel()}.Sanitize() + ";\nLISTEN " + pgx.Identifier{t.ReserveChannel()}.Sanitize() +
		fmt.Sprintf(";\nSELECT pg_try_advisory_lock_shared(%d, %d)", Space, t.Roster())
	if q.Lease > 0 && q.Wait > 0 {
		join += ", set_config('idle_session_timeout', '0', false)" // a watcher holds no lock
	}
	l.f = nil
	switch {
	case !l.funcsTried:
		// One implicit transaction: when the functions cannot be created,
		// the LISTEN is rolled back with them (the roster lock is a session
		// lock and stays, which is harmless). The functions are rows in
		// the catalog: the commit writes WAL, and waits for no
		// synchronous standby (the session's synchronous_commit is local).
		_, qerr := l.conn.Exec(ctx, quietFuncs+"\n"+join, pgx.QueryExecModeSimpleProtocol)
		if qerr != nil && (ctx.Err() != nil || !lasting(qerr)) {
			return false, "", qerr
		}
		l.funcsTried, l.funcs = true, qerr == nil
	case l.funcs:
		if _, err := l.conn.Exec(ctx, join, pgx.QueryExecModeSimpleProtocol); err != nil {
			return false, "", err
		}
	}
	if l.funcs && q.Wait > 0 {
		l.f = newFollower(t, q, l.identity)
	}
	holder, pid, _, err := scanHolder(l.conn.QueryRow(ctx, t.holderSQL))
	if err != nil {
		return false, "", err
	}
	if l.f != nil {
		l.f.leaderPID, l.f.leader = pid, holder
	}
	l.watchedPID = pid
	return l.f != nil, holder, nil
}

// lasting reports whether err, the server's refusal to create the quiet
// functions, will refuse every later try on the session too: anything but
// a refusal that may pass, which a session that fell back to the plain
// round for good would turn into a lock wait, and a lock_timeout ERROR in
// the server's log, every round for its life. Those that may pass: a lock
// wait past the session's lock_timeout (autovacuum truncating pg_proc holds
// it exclusively for a moment; so does an administrator's LOCK on it), a full lock
// table (53200, which any role can cause), a deadlock or serialization
// failure, a cancel; and no answer from the server at all.
func lasting(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) != 5 {
		return false
	}
	switch pgErr.Code[:2] {
	case "08", "40", "53", "55", "57", "58":
		return false
	}
	return true
}

// WatchedPID is the backend pid of the holder the last Watch saw (0:
// none).
func (l *Lease) WatchedPID() int32 { return l.watchedPID }

// quietCampaign runs one quiet round: an heir's lock wait, or a watcher's
// wait for a notification or its next poll; or, when a notification said
// the leader changed, a holder lookup (see follower.verify).
func (l *Lease) quietCampaign(ctx context.Context, t *Target) (Round, error) {
	f := l.f
	for {
		switch f.next(time.Now()) {
		case stepLookup:
			return l.lookup(ctx, t, nil)
		case stepPause:
			if verify, err := l.watch(ctx, t, &f.pauseUntil); verify || err != nil {
				return l.lookup(ctx, t, err)
			}
			continue
		case stepWatch:
			if verify, err := l.watch(ctx, t, &f.nextPoll); verify || err != nil {
				return l.lookup(ctx, t, err)
			}
			continue
		}
		break
	}
	sent := time.Now()
	waiting := f.waiting(sent)
	code, waited, err := l.runRound(ctx, t, waiting)
	if err != nil {
		return Round{}, err
	}
	l.notified(t)
	return f.took(code, grantedFrom(sent, waited, time.Now()), l.sess.PID)
}

// runRound calls the heir's wait or the watcher's poll, and returns its
// answer. An heir's wait is not interrupted by closing the connection
// (ctx's usual effect in pgx): when ctx ends, a cancel request ends the
// server's wait (once it is 50 ms old, unless it ends by itself soon: see
// cancelOnDone), which the procedure catches (no line in the server's
// log), and the round returns as a busy one. Otherwise only
// its client-side deadline, Wait plus Slack (a silent network), closes the
// connection.
func (l *Lease) runRound(ctx context.Context, t *Target, waiting bool) (code int32, waited time.Duration, err error) {
	f := l.f
	var gate *int32
	if !f.gateOff {
		gate = &f.gate
	}
	sql, args := f.pollSQL, []any{l.mode(), t.ClassID, t.ObjID, t.ObjSubID, int32(l.sess.PID), l.sess.Token, f.slots, f.lease(), gate, f.me}
	wait := f.Wait
	if waiting && f.shortWait > 0 {
		wait = min(wait, f.shortWait)
	}
	f.shortWait = 0 // for this round only
	if waiting {
		var slot *int32
		if f.heir >= 0 {
			slot = &f.slots[f.heir]
		}
		sql, args = f.waitSQL, []any{l.mode(), t.ClassID, t.ObjID, t.ObjSubID, int32(l.sess.PID), l.sess.Token, int32(max(1, wait.Milliseconds())), slot, gate, f.me}
		dl := time.Now().Add(wait + f.Slack)
		if d, ok := ctx.Deadline(); ok && d.Before(dl) {
			dl = d
		}
		if err := ctx.Err(); err != nil {
			return 0, 0, err // stopping: no wait to start and cancel
		}
		var cancel context.CancelFunc
		parent := ctx
		ctx, cancel = context.WithDeadline(context.WithoutCancel(ctx), dl)
		defer cancel()
		defer l.cancelOnDone(parent, cancel, time.Now(), wait)()
	} else {
		f.nextPoll = time.Now().Add(f.Poll*3/4 + rand.N(f.Poll/4+1))
	}
	var plan []byte
	dest := []any{&code}
	if waiting {
		dest = append(dest, &plan)
	}
	if err := l.conn.QueryRow(ctx, sql, args...).Scan(dest...); err != nil {
		if waiting && ctx.Err() == context.DeadlineExceeded {
			return 0, 0, fmt.Errorf("%w: no answer to an heir's round within its lock wait (%s) plus %s: %w", ErrConnectionLost, wait, f.Slack, err)
		}
		return 0, 0, Pooling(err)
	}
	return code, executionTime(plan), nil
}

// executionTime is the "Execution Time" (ms) of plan, the JSON an heir's
// wait ran under EXPLAIN ANALYZE gave (pgleader_wait): the wait's length
// as the server measured it. 0 (no measure: the window opens at the
// round's send time) for a round that measured none (NULL), and for
// anything but a positive number in the digits and point the server
// writes (%.3f) there. The key is the plan's last property.
func executionTime(plan []byte) time.Duration {
	const key = `"Execution Time":`
	i := bytes.LastIndex(plan, []byte(key))
	if i < 0 {
		return 0
	}
	v := bytes.TrimLeft(plan[i+len(key):], " \t\r\n")
	n := 0
	for n < len(v) && (v[n] >= '0' && v[n] <= '9' || v[n] == '.') {
		n++
	}
	if n < len(v) && !bytes.ContainsAny(v[n:n+1], " \t\r\n,}") {
		return 0 // 1e3, 5x: not a number the server writes
	}
	ms, err := strconv.ParseFloat(string(v[:n]), 64)
	if err != nil || ms <= 0 || ms > float64(math.MaxInt64/time.Millisecond) {
		return 0
	}
	return time.Duration(ms * float64(time.Millisecond))
}

// grantedFrom is when a trust window that a round's grant opens may run
// from: the round's send time plus how long its lock wait took before the
// grant, as the server measured it on its monotonic clock (the wait began
// after the round was sent, and ended after the grant: the sum is no later
// than the grant's statement ended, and the server's lease runs from
// later than that, as from a check sent then). An heir granted late in a
// long wait then starts to lead without a check of its own first (see
// elector's staleGrant), where its send time alone would leave little or
// none of the window. Never later than now: a measure longer than the
// round itself took on this side is no measure of it.
func grantedFrom(sent time.Time, waited time.Duration, now time.Time) time.Time {
	if waited <= 0 {
		return sent
	}
	return sent.Add(min(waited, now.Sub(sent)))
}

// cancelOnDone sends the server one cancel request for the running
// statement, a wait of length wait sent at sent, once parent ends; the
// session procedure catches it. As the crash watch does (see cancelPlan),
// it sends none to a wait younger than ringCancelAge (it waits until the
// wait is that old: a request that reaches the backend as the statement
// enters the procedure, before any handler, is an ERROR the server logs)
// and none to a wait that ends by itself within ringCancelMargin or an
// eighth of its length. Should the statement still run cancelAgain after
// the request (it reached the backend before the statement did, and the
// server ignored it), it ends the round (endRound: pgx then closes the
// connection, with a Terminate the backend reads once its wait is over).
// The function it returns waits for a request in flight, so that the
// request never reaches the session's next statement.
func (l *Lease) cancelOnDone(parent context.Context, endRound context.CancelFunc, sent time.Time, wait time.Duration) func() {
	finished, done := make(chan struct{}), make(chan struct{})
	stop := context.AfterFunc(parent, func() {
		defer close(done)
		delay, send := cancelPlan(time.Since(sent), wait)
		if !send {
			return
		}
		select {
		case <-finished:
			return
		case <-time.After(delay):
		}
		cctx, cancel := context.WithTimeout(context.Background(), cancelAgain)
		defer cancel()
		_ = l.conn.PgConn().CancelRequest(cctx)
		select {
		case <-finished:
		case <-time.After(cancelAgain):
			endRound()
		}
	})
	return func() {
		close(finished)
		if !stop() {
			<-done
		}
	}
}

// lookup reads the holder from pg_locks (a round of its own), after a
// notification said the leader changed: what the round reports as the
// holder is what the server proves, never a notification's payload.
func (l *Lease) lookup(ctx context.Context, t *Target, err error) (Round, error) {
	if err != nil {
		return Round{}, err
	}
	q := l.f
	l.lookups++
	holder, pid, free, err := scanHolder(l.conn.QueryRow(ctx, t.holderSQL, l.mode()))
	if err != nil {
		return Round{}, err
	}
	now := time.Now()
	switch {
	case pid != 0 && pid != q.leaderPID:
		// A new leader: the heir it was freed its slot. A resigned leader,
		// or a crashed one that reconnects, takes it at its first poll; in
		// case neither comes back, one watcher in eight also polls soon, at
		// a random point within Spread, so that a large fleet
		// refills the slot at once without all of it waking the server
		// together.
		q.namedUntil, q.gateSince, q.gateOff = time.Time{}, time.Time{}, false
		if rand.N(refillOneIn) == 0 {
			q.nextPoll = minTime(q.nextPoll, now.Add(rand.N(q.Spread+1)))
		}
		q.verifyGap = q.VerifyEvery
	case pid == q.leaderPID:
		q.verifyGap = min(2*q.verifyGap, verifyCap*q.VerifyEvery) // the notification was false
	}
	q.leaderPID, q.leader = pid, holder
	q.verify, q.lastLookup = false, now
	if h := q.heard; h.pid != 0 && int32(h.pid) == pid && now.Sub(h.at) < reservationBinds {
		l.reserved(t, h)
	}
	q.heard = reservation{}
	// With values on, every lookup (an announcement made it due, or the
	// session's first) tells the caller to read the leader's value again.
	return Round{Holder: holder, HolderPID: pid, Free: free, Busy: true, Refresh: t.values}, nil
}

// ReservationBinds bounds how long a reservation binds a follower (see
// handover.go): a named candidate queues at most that long, and a
// follower gives won locks back to the leader's gate at most that long.
// The leader releases the reservation once the named candidate holds the
// lock, or a bound after its unlock.
const ReservationBinds = 15 * time.Second

// reservationBinds is ReservationBinds, shorter in tests.
var reservationBinds = ReservationBinds

// reserved records a reservation the leader announced: the candidate it
// names queues on the lock.
func (l *Lease) reserved(t *Target, r reservation) {
	if r.to == l.identity {
		l.f.namedUntil = r.at.Add(reservationBinds)
	}
}

// heard takes in one notification (see messages.go): nothing in it is
// believed but what a pid the server proved says; the rest only makes a
// lookup (rate-limited) or an early poll (at most one per heir's wait) due.
func (l *Lease) heard(t *Target, n *pgconn.Notification) {
	q := l.f
	if q == nil || n.PID == l.sess.PID {
		return
	}
	now := time.Now()
	leader := q.leaderPID != 0 && int32(n.PID) == q.leaderPID
	switch {
	case n.Channel == t.ReserveChannel() && n.Payload != "":
		if leader {
			l.reserved(t, reservation{pid: n.PID, to: n.Payload, at: now})
			return
		}
		// From a pid not (yet) proven the leader's: a lookup tells.
		q.heard = reservation{pid: n.PID, to: n.Payload, at: now}
		q.verifyAt = q.dueAt(q.verifyGap)
		q.verify = true
	case n.Channel != t.Channel():
	case n.Payload != "" && leader:
		// The leader announced itself again: a value it proclaimed. With
		// values on, look now: the lookup's round tells the caller to
		// read the value (Round.Refresh).
		if t.values {
			q.verify, q.verifyAt = true, now
		}
	case n.Payload != "" && !leader:
		// A new leader, or a false announcement: a lookup tells.
		if !q.verify {
			q.verifyAt = q.dueAt(q.verifyGap)
		}
		q.verify = true
	case n.Payload == "" && (leader || !now.Before(q.hintAt)):
		// A vacancy: a leader stepped down and no heir took the lock. Poll
		// now (within 20 ms, so that watchers spread out); from a pid not
		// proven the leader's, at most once per heir's wait.
		if !leader {
			q.hintAt = now.Add(q.Spread)
		}
		q.nextPoll = minTime(q.nextPoll, now.Add(rand.N(vacancySpread)))
	}
}

// dueAt is when a lookup may run, gap after the last one; a pending one
// that is due earlier stays.
func (q *follower) dueAt(gap time.Duration) time.Time {
	at := q.lastLookup.Add(gap)
	if q.verify && q.verifyAt.Before(at) {
		return q.verifyAt
	}
	return at
}

// Stepped tells t's quiet campaign that this session has just stepped
// down as t's leader: it heard no announcement while it led, so its next
// round looks the holder up.
func (l *Lease) Stepped(t *Target) {
	if q := l.f; q != nil {
		q.leaderPID, q.verify, q.verifyAt = int32(l.sess.PID), true, time.Time{}
	}
}

// watch waits, as a watcher, until *until (its next poll) is due, and
// returns early, with verify, when a lookup is due (see heard), or
// without when the leader reserved the lock for this session.
func (l *Lease) watch(ctx context.Context, t *Target, until *time.Time) (verify bool, err error) {
	q := l.f
	for {
		now := time.Now()
		switch {
		case now.Before(q.namedUntil):
			return false, nil
		case q.verify && !now.Before(q.verifyAt):
			return true, nil
		case !now.Before(*until):
			return false, nil
		}
		deadline := *until
		if q.verify {
			deadline = minTime(deadline, q.verifyAt)
		}
		wctx, cancel := context.WithDeadline(ctx, deadline)
		n, err := l.conn.WaitForNotification(wctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return false, ctx.Err()
		case err == nil:
			l.heard(t, n)
			if !q.waiting(time.Now()) {
				// A watcher: a hint may have made its poll due sooner. (An
				// heir's poll time means nothing: its pause, until a
				// lookup or after a lock given back, holds.)
				*until = minTime(*until, q.nextPoll)
			}
		case errors.Is(err, context.DeadlineExceeded):
		default:
			return false, fmt.Errorf("%w: %w", ErrConnectionLost, err)
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// ShortenWait bounds the wait of t's next round on this session to d,
// when that round is an heir's wait (it is forgotten otherwise): the
// elector ends a wait early when a ranked candidate's rank is due to be
// told again, which it can only do between rounds.
func (l *Lease) ShortenWait(t *Target, d time.Duration) {
	if l.f != nil && d > 0 {
		l.f.shortWait = d
	}
}

// Heir reports whether this session queues on t's lock (holds one of its
// heir slots); false for a watcher and for the plain round.
func (l *Lease) Heir(t *Target) bool { return l.f != nil && l.f.heir >= 0 }

// notified takes in the notifications received so far (see heard).
func (l *Lease) notified(t *Target) {
	for {
		// With a done context this returns a buffered notification, or
		// nothing at once, without touching the connection.
		n, _ := l.conn.WaitForNotification(doneCtx)
		if n == nil {
			return
		}
		l.heard(t, n)
	}
}

// doneCtx is a context that has already ended.
var doneCtx = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()
