package lockconn

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Handover on demand. Anyone asks a key's leader to step down with a
// NOTIFY on the key's resign channel (ResignChannel); the payload names the
// candidate to hand over to, or is empty for any. The leader listens there
// while it leads (followers do not: a flood of requests would wake them
// for nothing), checks the asker's role, and answers on the asker's reply
// channel (ReplyChannel of the asker's backend pid), which the asker
// listens on.
//
// A handover to a named candidate reserves the lock for it: the leader
// takes the key's gate lock and the candidate's name lock (both in
// Space's space) and announces the reservation on the key's reserve
// channel, before it steps down, and releases both once the named
// candidate holds the lock or a bound has passed. When the candidate
// waits behind other heirs of the key, the leader ends their waits and
// they queue again behind it (see reserveWake and Precede), so that the
// server grants the released lock to the candidate. The followers believe
// the announcement only from the pid a lookup proved the leader's: the
// named one then queues on the lock, and any other quiet candidate that
// wins the lock meanwhile gives it back in the same statement (its
// campaign function checks that the gate is held by that same pid), so
// the lock goes down the wait queue to the named one. A reservation binds
// for ReservationBinds at most. Any role can take the gate or a name lock,
// but no follower heeds one it did not hear the leader announce, and the
// gate never touches safety: it only decides which candidate keeps a lock
// it won.

// ResignChannel is the NOTIFY channel of resign requests for t.
func (t *Target) ResignChannel() string {
	return fmt.Sprintf("pgleader.resign.%d.%d.%d", t.ClassID, t.ObjID, t.ObjSubID)
}

// ReserveChannel is the NOTIFY channel on which t's leader announces a
// reservation for a named candidate (see Reserve).
func (t *Target) ReserveChannel() string {
	return fmt.Sprintf("pgleader.reserve.%d.%d.%d", t.ClassID, t.ObjID, t.ObjSubID)
}

// ReplyChannel is the NOTIFY channel on which a leader answers the resign
// request of the backend pid.
func ReplyChannel(pid uint32) string { return fmt.Sprintf("pgleader.reply.%d", pid) }

// Request is a resign request a leader read: the asker's backend pid, and
// the identity it named ("" for any candidate); or, with Rank set, a
// candidate's rank (see SendRank), which is no request to resign.
type Request struct {
	PID  uint32
	To   string
	Rank *Rank
}

// A request's payload is addressed: "<leader's backend pid> <to>" (to
// may be empty, and may hold spaces; the pid never does). An asker sends
// it again until it is answered, as the leader it saw in pg_locks may not
// listen yet: it begins to with its first renew, after OnElected started.
// The address keeps a copy that arrives after a handover from reaching
// the next leader, which has another backend.

// RequestPayload is the payload of a request to the leader on backend
// leaderPID, naming to ("" for any candidate).
func RequestPayload(leaderPID uint32, to string) string {
	return strconv.FormatUint(uint64(leaderPID), 10) + " " + to
}

// ParseRequest reads a request's payload; ok is false when it is not one.
func ParseRequest(payload string) (leaderPID uint32, to string, ok bool) {
	num, to, found := strings.Cut(payload, " ")
	pid, err := strconv.ParseUint(num, 10, 32)
	if !found || err != nil || pid == 0 || num != strconv.FormatUint(pid, 10) {
		return 0, "", false
	}
	return uint32(pid), to, true
}

// Requester reads who asked: the role of the backend pid, and whether it
// may ask: a superuser, a member of this session's role, or a member of a
// role in roles. found is false when the asker's session is gone.
func (l *Lease) Requester(ctx context.Context, pid uint32, roles []string) (role string, allowed, found bool, err error) {
	if roles == nil {
		roles = []string{}
	}
	err = l.conn.QueryRow(ctx, statement("handover", "requester"), int32(pid), roles).Scan(&role, &allowed)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, false, nil
	}
	if err != nil {
		return "", false, false, err
	}
	return role, allowed, true, nil
}

// Reply answers the resign request of the backend pid.
func (l *Lease) Reply(ctx context.Context, pid uint32, msg string) error {
	_, err := l.conn.Exec(ctx, statement("handover", "reply"), ReplyChannel(pid), msg)
	return err
}

// Standing reports whether a session named identity stands for t: it
// holds t's roster lock (a quiet candidate) or waits for t's lock.
func (l *Lease) Standing(ctx context.Context, t *Target, identity string) (bool, error) {
	return Standing(ctx, l.conn, t, identity)
}

// Standing is Lease.Standing on any connection.
func Standing(ctx context.Context, conn *pgx.Conn, t *Target, identity string) (bool, error) {
	var ok bool
	err := conn.QueryRow(ctx, statement("handover", "standing"),
		identity, uint32(Space), uint32(t.Roster()), t.ClassID, t.ObjID, t.ObjSubID).Scan(&ok)
	return ok, err
}

// gateWait is the least time Reserve tries a taken gate for (a
// reservation ahead has no bound of its own): otherwise the handover's
// whole bound.
const gateWait = 25 * time.Millisecond

// Reserve reserves t's lock for the candidate named to, before this
// session (its leader) steps down: it takes t's gate and to's name lock and
// announces the reservation (see ReserveChannel). It then waits, up to
// within, until a session named to waits for the lock; on any failure it
// releases both.
func (l *Lease) Reserve(ctx context.Context, t *Target, to string, within time.Duration) error {
	queued, err := l.takeGate(ctx, t, to, time.Now().Add(max(within, gateWait)))
	if err != nil || queued {
		return err
	}
	deadline := time.Now().Add(within)
	for pause := time.Millisecond; ; pause = min(2*pause, 5*time.Millisecond) {
		// A watcher queues a few milliseconds after the announcement: look
		// again soon, then every 5 ms.
		time.Sleep(pause)
		err := l.conn.QueryRow(ctx, statement("handover", "queued"),
			to, t.ClassID, t.ObjID, t.ObjSubID).Scan(&queued)
		if err == nil && !queued && time.Now().After(deadline) {
			err = fmt.Errorf("%s did not queue for the lock within %s", to, within)
		}
		if err != nil {
			if rerr := l.release(ctx, t, to, true, true); rerr != nil {
				return rerr
			}
			return err
		}
		if queued {
			if l.wakes() {
				// As reserveWake does: the other heirs queue again behind
				// the candidate. A courtesy to the handover's speed only:
				// a failure matters when it lost the connection.
				_, err = l.conn.Exec(ctx, spareCall, t.ClassID, t.ObjID, t.ObjSubID, l.f.slots, to)
				if err != nil && l.conn.IsClosed() {
					return err
				}
			}
			return nil
		}
	}
}

// takeGate takes t's gate and to's name lock, and announces the
// reservation (the reserve statement), trying again until by while either
// is taken: a winner's probe holds the gate in share mode for
// microseconds; the leader before this one holds it until it sees this
// leader hold the lock (Unreserve), which a loaded server can make tens
// of milliseconds; another role may hold it for good (then the handover
// fails). It reports whether a session named to already waits for the
// lock; on a failure it holds neither lock.
func (l *Lease) takeGate(ctx context.Context, t *Target, to string, by time.Time) (queued bool, err error) {
	var gate, name bool
	sql, args := statement("handover", "reserve"), []any{Space, t.Gate(), t.NameLock(to), t.ReserveChannel(), to, t.ClassID, t.ObjID, t.ObjSubID}
	into := []any{&gate, &name, new(bool), &queued}
	if l.wakes() {
		sql, args, into = reserveWake, append(args, l.f.slots), append(into, new(*int32))
	}
	for pause := time.Millisecond; ; pause = min(2*pause, 5*time.Millisecond) {
		if err := l.conn.QueryRow(ctx, sql, args...).Scan(into...); err != nil {
			return false, err
		}
		if gate && name {
			return queued, nil
		}
		if err := l.release(ctx, t, to, gate, name); err != nil {
			return false, err
		}
		if time.Now().After(by) {
			return false, fmt.Errorf("pgleader: the gate of %s stays taken", t.Channel())
		}
		time.Sleep(pause)
	}
}

// reserveWake is the reserve statement that also, when the named
// candidate waits for the key behind another of its heirs, ends those
// heirs' waits (pgleader_wake, sparing the candidate): they queue again
// behind it, and the lock this leader releases goes to the candidate at
// once, rather than to an heir that wins it, finds the gate taken and
// gives it back (a few milliseconds of the handover's). Precede usually
// did that already, off the handover's path. The reserve statement's scan
// runs once, in a subquery its volatile functions keep from being
// flattened into this one.
var reserveWake = "SELECT r.g, r.n, r.announced, r.queued, CASE WHEN r.queued THEN pg_temp.pgleader_wake($6::oid, $7::oid, $8::int2, $9::int4[], $5) END FROM (" +
	statement("handover", "reserve") + " OFFSET 0) r"

// spareCall ends the waits of t's heirs queued ahead of the candidate
// named $5 (see pgleader_wake).
const spareCall = "SELECT pg_temp.pgleader_wake($1::oid, $2::oid, $3::int2, $4::int4[], $5::text)"

// Precede readies a handover to the candidate named to, off the
// handover's path: it reads what the reservation will (a session's first
// such read loads its catalog caches), and when the candidate waits for
// t's lock behind another of t's heirs, it ends those heirs' waits, so
// that they queue again behind it (see pgleader_wake). It reports whether
// the candidate stands (see Standing), and whether it now waits first in
// the queue; first is true too when this session cannot end waits (it
// has no session functions): there is nothing more to do.
func (l *Lease) Precede(ctx context.Context, t *Target, to string) (standing, first bool, err error) {
	standing, err = l.Standing(ctx, t, to)
	if err != nil || !standing {
		return standing, false, err
	}
	if !l.wakes() {
		return true, true, nil
	}
	var n int32
	if err := l.conn.QueryRow(ctx, spareCall, t.ClassID, t.ObjID, t.ObjSubID, l.f.slots, to).Scan(&n); err != nil {
		return true, false, err
	}
	// -2: the candidate does not wait for the lock (yet); -1: the
	// function could not look.
	return true, n >= 0, nil
}

// Unreserve waits, up to within, until a session named to holds t's lock,
// and releases the reservation Reserve took. It stops waiting early when
// no session named to waits for the lock either (the candidate is gone,
// or between two of its waits): the other candidates then need not wait
// out within. It returns the holder seen last ("" when the lock is free).
// Each look reads pg_locks, which copies the server's whole lock table
// (another role may have filled it): the looks start 2 ms apart, which
// most handovers need no more than once, and back off to 50 ms.
func (l *Lease) Unreserve(ctx context.Context, t *Target, to string, within time.Duration) (string, error) {
	deadline := time.Now().Add(within)
	holder := ""
	for pause := 2 * time.Millisecond; ; pause = min(2*pause, 50*time.Millisecond) {
		h, _, _, err := scanHolder(l.conn.QueryRow(ctx, t.holderSQL))
		if err != nil {
			return "", err
		}
		holder = h
		if Names(h, to) || time.Now().After(deadline) {
			break
		}
		var queued bool
		if err := l.conn.QueryRow(ctx, statement("handover", "queued"),
			to, t.ClassID, t.ObjID, t.ObjSubID).Scan(&queued); err != nil {
			return "", err
		}
		if !queued {
			break
		}
		time.Sleep(pause)
	}
	return holder, l.release(ctx, t, to, true, true)
}

// DropReservation releases the reservation Reserve took for the candidate
// named to at once, without waiting for anyone: the leader reserved ahead
// of a handover it no longer makes (see elector's prefer).
func (l *Lease) DropReservation(ctx context.Context, t *Target, to string) error {
	return l.release(ctx, t, to, true, true)
}

func (l *Lease) release(ctx context.Context, t *Target, to string, gate, name bool) error {
	_, err := l.conn.Exec(ctx, statement("handover", "release"),
		Space, t.Gate(), t.NameLock(to), gate, name)
	return err
}

// Holder returns the application_name of t's holder ("pid N" when it has
// none: a description for messages, never a leader's identity) and its
// backend pid ("" and 0 when the lock is free).
func Holder(ctx context.Context, conn *pgx.Conn, t *Target) (string, uint32, error) {
	h, pid, _, err := scanHolder(conn.QueryRow(ctx, t.holderSQL))
	if h == "" && pid != 0 {
		h = fmt.Sprintf("pid %d", pid)
	}
	return h, uint32(pid), err
}
