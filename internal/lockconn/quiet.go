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
// another candidate (see Lease.Reserve): the key's gate lock is held by the
// leader that hands over, and this session's name lock is not (6).
const reservedSQL = `IF NOT (pg_try_advisory_lock_shared(HEIRCLASS, gate) AND pg_advisory_unlock_shared(HEIRCLASS, gate))
    AND (pg_try_advisory_lock_shared(HEIRCLASS, me) AND pg_advisory_unlock_shared(HEIRCLASS, me)) THEN
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
	// off again. 0 on servers before PostgreSQL 14, which lack it.
	Lease time.Duration
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
	// namedUntil: a handover names this session (see handover.go), so it
	// queues on the lock until then, slot or not.
	namedUntil time.Time
	// pauseUntil: the lock this session won was reserved for another
	// candidate; it waits before queueing again.
	pauseUntil time.Time
	gate, me   int32 // the key's gate lock and this session's name lock
}

// prepareQuiet builds t's quiet SQL for the session sess.
func (t *Target) prepareQuiet(q Quiet, identity string) {
	n := len(t.Vals) + 1
	common := fmt.Sprintf("%s, %d::oid, %d::oid, %d::int2, $%d::int4, $%d::text", t.Args, t.ClassID, t.ObjID, t.ObjSubID, n, n+1)
	st := &quietState{Quiet: q, heir: -1,
		waitSQL: fmt.Sprintf("SELECT pg_temp.pgleader_wait(%s, $%d::int4, $%d::int4, $%d::int4, $%d::int4)", common, n+2, n+3, n+4, n+5),
		pollSQL: fmt.Sprintf("SELECT pg_temp.pgleader_poll(%s, $%d::int4[], $%d::int4, $%d::int4, $%d::int4)", common, n+2, n+3, n+4, n+5),
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
// share mode and listens on t's channel, in one round trip, and reports
// whether the quiet campaign is on. In a second round trip it returns the
// holder seen now (one pg_locks read per connection), for Leader() before
// the first notification. When the functions cannot be created the
// session keeps the plain round, and that is no error. Call it once per
// session and target.
func (l *Lease) Watch(ctx context.Context, t *Target, q Quiet) (quiet bool, holder string, err error) {
	join := "LISTEN " + pgx.Identifier{t.Channel()}.Sanitize() + ";\nLISTEN " + pgx.Identifier{t.ResignChannel()}.Sanitize() +
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
	holder, _, _, err = scanHolder(l.conn.QueryRow(ctx, t.holderSQL))
	if err != nil {
		return false, "", err
	}
	return t.quiet != nil, holder, nil
}

// quietCampaign runs one quiet round: an heir's lock wait, or a watcher's
// wait for a notification or its next poll.
func (l *Lease) quietCampaign(ctx context.Context, t *Target) (Round, error) {
	q := t.quiet
	var sql string
	var args []any
	if time.Now().Before(q.pauseUntil) {
		if holder, err := l.watch(ctx, t, &q.pauseUntil); holder != "" || err != nil {
			return Round{Holder: holder, Busy: true}, err
		}
	}
	waiting := q.heir >= 0 || time.Now().Before(q.namedUntil)
	if !waiting {
		if holder, err := l.watch(ctx, t, &q.nextPoll); holder != "" || err != nil {
			return Round{Holder: holder, Busy: true}, err
		}
		waiting = time.Now().Before(q.namedUntil)
	}
	if waiting {
		sql = q.waitSQL
		var slot *int32
		if q.heir >= 0 {
			slot = &q.slots[q.heir]
		}
		args = append(append(append(args, l.mode()), t.Vals...), int32(l.sess.PID), l.sess.Token, int32(max(1, q.Wait.Milliseconds())), slot, q.gate, q.me)
	} else {
		sql = q.pollSQL
		var lease *int32
		if q.Lease > 0 {
			ms := int32(q.Lease.Milliseconds())
			lease = &ms
		}
		args = append(append(append(args, l.mode()), t.Vals...), int32(l.sess.PID), l.sess.Token, q.slots, lease, q.gate, q.me)
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
	rd := Round{Holder: l.notified(t), Sent: sent}
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
		// candidate. Wait a little rather than win it again at once.
		rd.Busy = true
		q.pauseUntil = time.Now().Add(50 * time.Millisecond)
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

// watch waits, as a watcher, until *until (its next poll) is due: it
// returns earlier with the leader a notification announced (its own
// session's announcements are not news), and at once when a handover names
// this session.
func (l *Lease) watch(ctx context.Context, t *Target, until *time.Time) (string, error) {
	for time.Now().Before(*until) {
		wctx, cancel := context.WithDeadline(ctx, *until)
		n, err := l.conn.WaitForNotification(wctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return "", ctx.Err()
		case err == nil:
			if l.named(t, n) {
				return "", nil
			}
			if n.Channel == t.Channel() && n.Payload == "" && n.PID != l.sess.PID {
				// A leader stepped down and no heir took the lock: poll
				// now (within 20 ms, so that watchers spread out).
				t.quiet.nextPoll = minTime(t.quiet.nextPoll, time.Now().Add(rand.N(20*time.Millisecond)))
				*until = minTime(*until, t.quiet.nextPoll)
				continue
			}
			if n.Channel == t.Channel() && n.Payload != "" && n.PID != l.sess.PID {
				// A new leader: the heir it was freed its slot. A resigned
				// leader, or a crashed one that reconnects, takes it at its
				// first poll; in case neither comes back, one watcher in
				// eight also polls soon, at a random point within an heir's
				// wait, so that a large fleet refills the slot at once
				// without all of it waking the server together.
				q := t.quiet
				q.namedUntil = time.Time{}
				if rand.N(8) == 0 {
					q.nextPoll = minTime(q.nextPoll, time.Now().Add(rand.N(q.Wait+1)))
				}
				return n.Payload, nil
			}
		case errors.Is(err, context.DeadlineExceeded):
			return "", nil
		default:
			return "", fmt.Errorf("%w: %w", ErrConnectionLost, err)
		}
	}
	return "", nil
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

// notified drains the notifications received so far and returns the
// latest leader announced on t's channel ("" when none).
func (l *Lease) notified(t *Target) string {
	latest := ""
	for {
		// With a done context this returns a buffered notification, or
		// nothing at once, without touching the connection.
		n, _ := l.conn.WaitForNotification(doneCtx)
		if n == nil {
			return latest
		}
		switch {
		case l.named(t, n):
		case n.Channel != t.Channel() || n.PID == l.sess.PID:
		case n.Payload != "":
			latest = n.Payload
			if t.quiet != nil {
				t.quiet.namedUntil = time.Time{}
			}
		case t.quiet != nil:
			// A vacancy (see Target.unlockSQL) read with a round's reply.
			t.quiet.nextPoll = minTime(t.quiet.nextPoll, time.Now().Add(rand.N(20*time.Millisecond)))
		}
	}
}

// doneCtx is a context that has already ended.
var doneCtx = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// named notes a resign request that names this session: it then queues on
// the lock for up to namedFor, so that the leader's reservation can hand
// the lock to it (see handover.go).
func (l *Lease) named(t *Target, n *pgconn.Notification) bool {
	if n.Channel != t.ResignChannel() || n.Payload == "" || n.Payload != l.identity || t.quiet == nil {
		return false
	}
	t.quiet.namedUntil = time.Now().Add(namedFor)
	return true
}

// namedFor is how long a named candidate keeps queueing on the lock: long
// enough for the leader's OnElected to return in most handovers.
const namedFor = 15 * time.Second
