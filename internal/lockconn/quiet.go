package lockconn

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strings"
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
//     a space of pgleader's own (classid HeirClass), taken with
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

// HeirClass is the first half (pg_locks' classid) of the advisory pair keys
// pgleader uses for a key's roster and heir slots: "pgLH". An application
// that takes pair keys with this first half may delay elections (a slot it
// holds is a slot no follower can take) but never breaks their safety.
const HeirClass int32 = 0x70674C48

// quietTemplate is the functions' SQL for both key spaces; K stands for
// the key's arguments, P for its parameters, MINE for "this backend holds
// the lock", GUARD for guardSQL.
const quietTemplate = `
CREATE OR REPLACE FUNCTION pg_temp.pgleader_wait(P, c oid, o oid, s int2, pid int4, tok text, wait_ms int, heir int4, gate int4, me int4) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $f$
DECLARE
  won int := 1;
BEGIN
  GUARD
  IF MINE THEN
    won := 3;
  ELSE
    BEGIN
      PERFORM set_config('lock_timeout', wait_ms::text, true);
      PERFORM pg_advisory_lock(K);
    EXCEPTION WHEN lock_not_available THEN
      IF NOT (MINE) THEN
        RETURN 0;
      END IF;
    END;
  END IF;
  RESERVED
  IF heir IS NOT NULL THEN
    PERFORM pg_advisory_unlock(HEIRCLASS, heir);
  END IF;
  RETURN won;
END $f$;
CREATE OR REPLACE FUNCTION pg_temp.pgleader_poll(P, c oid, o oid, s int2, pid int4, tok text, slots int4[], lease_ms int, gate int4, me int4) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
  GUARD
  IF pg_try_advisory_lock_shared(K) AND pg_advisory_unlock_shared(K) THEN
    IF MINE THEN
      RETURN 3;
    ELSIF pg_try_advisory_lock(K) THEN
      RESERVED
      IF lease_ms IS NOT NULL THEN
        PERFORM set_config('idle_session_timeout', lease_ms::text, false);
      END IF;
      RETURN 1;
    END IF;
  END IF;
  FOR i IN 1 .. coalesce(array_length(slots, 1), 0) LOOP
    IF pg_try_advisory_lock(HEIRCLASS, slots[i]) THEN
      IF lease_ms IS NOT NULL THEN
        PERFORM set_config('idle_session_timeout', lease_ms::text, false);
      END IF;
      RETURN 9 + i;
    END IF;
  END LOOP;
  RETURN 0;
END $f$;`

// reservedSQL gives a lock just won back when a handover reserves it for
// another candidate (see Lease.Reserve): 6. Any role can take any advisory
// lock, the gate included, so the gate binds only as far as the server
// proves it, at the moment of the win: it must be held exclusively by a
// session of this session's own login role (the fleet's; pg_locks and
// pg_stat_activity are read only when the gate is held and this session
// won: a handover, or an attack); gate is NULL once this session has given
// won locks back for longer than ReservationBinds, until a new leader; and
// this session's name lock must not be held (it is not the candidate
// named). The check cannot rest on what the session knew when its round
// began: an heir's wait may have begun before the leader it hands over
// from was elected.
const reservedSQL = `IF gate IS NOT NULL
    AND NOT (pg_try_advisory_lock_shared(HEIRCLASS, gate) AND pg_advisory_unlock_shared(HEIRCLASS, gate))
    AND (pg_try_advisory_lock_shared(HEIRCLASS, me) AND pg_advisory_unlock_shared(HEIRCLASS, me))
    AND EXISTS (SELECT FROM pg_locks l JOIN pg_stat_get_activity(NULL) a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.classid = HEIRCLASS
      AND l.objid = (gate::int8 & 4294967295)::oid AND l.objsubid = 2 AND l.granted AND l.mode = 'ExclusiveLock'
      AND a.usesysid = (SELECT usesysid FROM pg_stat_get_activity(pg_backend_pid()))) THEN
    PERFORM pg_advisory_unlock(K);
    RETURN 6;
  END IF;`

// guardSQL opens both functions: a standby gets 4 (ErrStandby), and a
// backend other than the session's own, or without its token, gets 5
// (ErrTransactionPooling), before anything is locked.
const guardSQL = `IF pg_is_in_recovery() THEN
    RETURN 4;
  END IF;
  IF pg_backend_pid() <> pid OR current_setting('pgleader.owner', true) IS DISTINCT FROM tok THEN
    RETURN 5;
  END IF;`

const mineTemplate = `(pg_try_advisory_lock_shared(K) AND pg_advisory_unlock_shared(K)) AND EXISTS (SELECT FROM pg_locks l WHERE l.locktype = 'advisory'
      AND l.classid = c AND l.objid = o AND l.objsubid = s AND l.granted AND l.mode = 'ExclusiveLock' AND l.pid = pg_backend_pid())`

// quietFuncs creates both functions for both key spaces.
var quietFuncs = func() string {
	var sb strings.Builder
	for _, space := range [][2]string{{"k int8", "k"}, {"a int4, b int4", "a, b"}} {
		mine := strings.ReplaceAll(mineTemplate, "(K)", "("+space[1]+")")
		tmpl := strings.NewReplacer("GUARD", guardSQL, "RESERVED", reservedSQL).Replace(quietTemplate)
		sb.WriteString(strings.NewReplacer("P,", space[0]+",", "(K)", "("+space[1]+")", "MINE", mine,
			"HEIRCLASS", fmt.Sprint(HeirClass)).Replace(tmpl))
	}
	return sb.String()
}()

// DefaultHeirs is the elector's number of heirs per key.
const DefaultHeirs = 2

// Quiet configures a session's quiet campaign for one key.
type Quiet struct {
	// Wait is an heir's lock wait per round; keep it under the server's
	// deadlock_timeout.
	Wait time.Duration
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

// Roster is the pair key's second half of t's roster lock, which every
// quiet candidate holds in share mode; slot i of t's heir slots is
// Roster()+1+i.
func (t *Target) Roster() int32 {
	h := fnv.New32a()
	fmt.Fprintf(h, "%d.%d.%d", t.ClassID, t.ObjID, t.ObjSubID)
	return int32(h.Sum32())
}

// quietState is a Target's quiet campaign on its current session.
type quietState struct {
	Quiet
	waitSQL, pollSQL string
	slots            []int32
	heir             int // the heir slot this session holds, or -1
	nextPoll         time.Time
	// namedUntil: the leader reserved the lock for this session (see
	// handover.go), so it queues on the lock until then, slot or not.
	namedUntil time.Time
	// pauseUntil: the lock this session won was reserved for another
	// candidate; it waits before queueing again.
	pauseUntil time.Time
	gate, me   int32 // the key's gate lock and this session's name lock

	// What the server proved of the holder, by a lookup in pg_locks (an
	// announcement only triggers one): its backend pid (0: unknown, or
	// nobody) and identity.
	leaderPID int32
	leader    string
	// verify: a notification says the leader may have changed; the lookup
	// runs at verifyAt at the earliest. A lookup that finds the holder it
	// knew (the notification was false) doubles verifyGap, up to eight
	// times VerifyEvery; one that finds a new holder resets it. A flood of
	// forged notifications thus costs each follower a lookup every 2 s.
	verify                       bool
	verifyAt, lastLookup, hintAt time.Time
	verifyGap                    time.Duration
	// heard: a reservation announced by a pid not yet proven the
	// leader's, kept until a lookup proves or disproves it.
	heard reservation
	// gateSince: since when this session gives won locks back to the
	// leader's gate; gateOff: no longer (past ReservationBinds), until a
	// new leader.
	gateSince time.Time
	gateOff   bool
}

// reservation is a reservation announcement.
type reservation struct {
	pid uint32
	to  string
	at  time.Time
}

// VerifyEvery is Quiet.VerifyEvery's default, and Observe's.
const VerifyEvery = 250 * time.Millisecond

// prepareQuiet builds t's quiet SQL for the session sess.
func (t *Target) prepareQuiet(q Quiet, identity string) {
	n := len(t.Vals) + 1
	common := fmt.Sprintf("%s, %d::oid, %d::oid, %d::int2, $%d::int4, $%d::text", t.Args, t.ClassID, t.ObjID, t.ObjSubID, n, n+1)
	if q.VerifyEvery <= 0 {
		q.VerifyEvery = VerifyEvery
	}
	st := &quietState{Quiet: q, heir: -1, verifyGap: q.VerifyEvery,
		waitSQL: t.mark + fmt.Sprintf("SELECT pg_temp.pgleader_wait(%s, $%d::int4, $%d::int4, $%d::int4, $%d::int4)", common, n+2, n+3, n+4, n+5),
		pollSQL: t.mark + fmt.Sprintf("SELECT pg_temp.pgleader_poll(%s, $%d::int4[], $%d::int4, $%d::int4, $%d::int4)", common, n+2, n+3, n+4, n+5),
	}
	if st.Slack <= 0 {
		st.Slack = 2 * time.Second
	}
	r := t.Roster()
	for i := range q.Heirs {
		st.slots = append(st.slots, r+1+int32(i))
	}
	st.gate, st.me = t.Gate(), t.NameLock(identity)
	t.quiet = st
}

// Watch prepares the session to campaign quietly for t: it creates the
// functions (the first time in the session), takes t's roster lock in
// share mode and listens on t's channel and its reservations' channel, in
// one round trip, and reports whether the quiet campaign is on. In a second
// round trip it returns the holder seen now (one pg_locks read per
// connection), for Leader() before the first notification. When the
// functions cannot be created the session keeps the plain round, and that
// is no error. Call it once per session and target. A follower does not
// listen for resign requests (a flood of them would wake it for nothing);
// a leader does, from its first renew (Announce) to its unlock.
func (l *Lease) Watch(ctx context.Context, t *Target, q Quiet) (quiet bool, holder string, err error) {
	join := "LISTEN " + pgx.Identifier{t.Channel()}.Sanitize() + ";\nLISTEN " + pgx.Identifier{t.ReserveChannel()}.Sanitize() +
		fmt.Sprintf(";\nSELECT pg_try_advisory_lock_shared(%d, %d)", HeirClass, t.Roster())
	if q.Lease > 0 && q.Wait > 0 {
		join += ", set_config('idle_session_timeout', '0', false)" // a watcher holds no lock
	}
	t.quiet = nil
	switch {
	case !l.quietTried:
		// One implicit transaction: when the functions cannot be created,
		// the LISTEN is rolled back with them (the roster lock is a session
		// lock and stays, which is harmless).
		l.quietTried = true
		_, qerr := l.conn.Exec(ctx, quietFuncs+"\n"+join, pgx.QueryExecModeSimpleProtocol)
		if qerr != nil && ctx.Err() != nil {
			return false, "", qerr
		}
		l.quiet = qerr == nil
	case l.quiet:
		if _, err := l.conn.Exec(ctx, join, pgx.QueryExecModeSimpleProtocol); err != nil {
			return false, "", err
		}
	}
	if l.quiet && q.Wait > 0 {
		t.prepareQuiet(q, l.identity)
	}
	holder, pid, _, err := scanHolder(l.conn.QueryRow(ctx, t.holderSQL))
	if err != nil {
		return false, "", err
	}
	if t.quiet != nil {
		t.quiet.leaderPID, t.quiet.leader = pid, holder
	}
	return t.quiet != nil, holder, nil
}

// quietCampaign runs one quiet round: an heir's lock wait, or a watcher's
// wait for a notification or its next poll; or, when a notification said
// the leader changed, a holder lookup (see quietState.verify).
func (l *Lease) quietCampaign(ctx context.Context, t *Target) (Round, error) {
	q := t.quiet
	var sql string
	var args []any
	if time.Now().Before(q.pauseUntil) {
		if verify, err := l.watch(ctx, t, &q.pauseUntil); verify || err != nil {
			return l.lookup(ctx, t, err)
		}
	}
	waiting := q.heir >= 0 || time.Now().Before(q.namedUntil)
	if waiting && q.verify && !time.Now().Before(q.verifyAt) {
		return l.lookup(ctx, t, nil)
	}
	if !waiting {
		if verify, err := l.watch(ctx, t, &q.nextPoll); verify || err != nil {
			return l.lookup(ctx, t, err)
		}
		waiting = time.Now().Before(q.namedUntil)
	}
	var gate *int32
	if !q.gateOff {
		gate = &q.gate
	}
	if waiting {
		sql = q.waitSQL
		var slot *int32
		if q.heir >= 0 {
			slot = &q.slots[q.heir]
		}
		args = append(append(append(args, l.mode()), t.Vals...), int32(l.sess.PID), l.sess.Token, int32(max(1, q.Wait.Milliseconds())), slot, gate, q.me)
	} else {
		sql = q.pollSQL
		var lease *int32
		if q.Lease > 0 {
			ms := int32(q.Lease.Milliseconds())
			lease = &ms
		}
		args = append(append(append(args, l.mode()), t.Vals...), int32(l.sess.PID), l.sess.Token, q.slots, lease, gate, q.me)
		q.nextPoll = time.Now().Add(q.Poll*3/4 + rand.N(q.Poll/4+1))
	}
	var code int32
	sent := time.Now()
	if waiting {
		// Stopping does not cancel an heir's lock wait: the server would
		// log the cancel as an ERROR with its statement. The wait ends by
		// itself within Wait; only the client-side deadline, Wait plus
		// Slack (a silent network), still interrupts it.
		dl := sent.Add(q.Wait + q.Slack)
		if d, ok := ctx.Deadline(); ok && d.Before(dl) {
			dl = d
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(context.WithoutCancel(ctx), dl)
		defer cancel()
	}
	if err := l.conn.QueryRow(ctx, sql, args...).Scan(&code); err != nil {
		if waiting && ctx.Err() == context.DeadlineExceeded {
			return Round{}, fmt.Errorf("%w: no answer to an heir's round within its lock wait (%s) plus %s: %w", ErrConnectionLost, q.Wait, q.Slack, err)
		}
		return Round{}, Pooling(err)
	}
	l.notified(t)
	rd := Round{Sent: sent}
	switch code {
	case 1:
		rd.Held, rd.Proven = true, true
	case 3:
		rd.Held, rd.Already, rd.Proven = true, true, true
	case 4:
		return rd, ErrStandby
	case 5:
		return rd, fmt.Errorf("%w: the session's function ran on a backend other than the session's own (pid %d) or without its token", ErrTransactionPooling, l.sess.PID)
	case 0:
		rd.Busy = true
	case 6:
		// Won, and given back: a handover reserves the lock for another
		// candidate. Wait a little rather than win it again at once, and no
		// longer than ReservationBinds in all.
		rd.Busy = true
		now := time.Now()
		q.pauseUntil = now.Add(50 * time.Millisecond)
		if q.gateSince.IsZero() {
			q.gateSince = now
		} else if now.Sub(q.gateSince) > reservationBinds {
			q.gateOff = true
		}
	default:
		if i := int(code) - 10; i >= 0 && i < len(q.slots) && q.heir < 0 {
			q.heir = i
			rd.Busy = true
			break
		}
		return rd, fmt.Errorf("pgleader: unexpected answer %d from the session's campaign function", code)
	}
	if rd.Held {
		q.heir = -1 // a win releases the slot
		q.namedUntil = time.Time{}
	}
	return rd, nil
}

// lookup reads the holder from pg_locks (a round of its own), after a
// notification said the leader changed: what the round reports as the
// holder is what the server proves, never a notification's payload.
func (l *Lease) lookup(ctx context.Context, t *Target, err error) (Round, error) {
	if err != nil {
		return Round{}, err
	}
	q := t.quiet
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
		// a random point within an heir's wait, so that a large fleet
		// refills the slot at once without all of it waking the server
		// together.
		q.namedUntil, q.gateSince, q.gateOff = time.Time{}, time.Time{}, false
		if rand.N(8) == 0 {
			q.nextPoll = minTime(q.nextPoll, now.Add(rand.N(q.Wait+1)))
		}
		q.verifyGap = q.VerifyEvery
	case pid == q.leaderPID:
		q.verifyGap = min(2*q.verifyGap, 8*q.VerifyEvery) // the notification was false
	}
	q.leaderPID, q.leader = pid, holder
	q.verify, q.lastLookup = false, now
	if h := q.heard; h.pid != 0 && int32(h.pid) == pid && now.Sub(h.at) < reservationBinds {
		l.reserved(t, h)
	}
	q.heard = reservation{}
	return Round{Holder: holder, HolderPID: pid, Free: free, Busy: true}, nil
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
		t.quiet.namedUntil = r.at.Add(reservationBinds)
	}
}

// heard takes in one notification (see messages.go): nothing in it is
// believed but what a pid the server proved says; the rest only makes a
// lookup (rate-limited) or an early poll (at most one per heir's wait) due.
func (l *Lease) heard(t *Target, n *pgconn.Notification) {
	q := t.quiet
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
			q.hintAt = now.Add(q.Wait)
		}
		q.nextPoll = minTime(q.nextPoll, now.Add(rand.N(20*time.Millisecond)))
	}
}

// dueAt is when a lookup may run, gap after the last one; a pending one
// that is due earlier stays.
func (q *quietState) dueAt(gap time.Duration) time.Time {
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
	if q := t.quiet; q != nil {
		q.leaderPID, q.verify, q.verifyAt = int32(l.sess.PID), true, time.Time{}
	}
}

// watch waits, as a watcher, until *until (its next poll) is due, and
// returns early, with verify, when a lookup is due (see heard), or
// without when the leader reserved the lock for this session.
func (l *Lease) watch(ctx context.Context, t *Target, until *time.Time) (verify bool, err error) {
	q := t.quiet
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
			*until = minTime(*until, q.nextPoll)
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

// Heir reports whether this session queues on t's lock (holds one of its
// heir slots); false for a watcher and for the plain round.
func (l *Lease) Heir(t *Target) bool { return t.quiet != nil && t.quiet.heir >= 0 }

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
