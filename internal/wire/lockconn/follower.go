package lockconn

import (
	"fmt"
	"time"
)

// The quiet follower's tuning: each value is a trade between how fast a
// fleet reacts and what it costs the server, named once here.
const (
	// VerifyEvery is Quiet.VerifyEvery's default, and Observe's: at most
	// one holder lookup per VerifyEvery after notifications.
	VerifyEvery = 250 * time.Millisecond
	// verifyCap bounds how far a flood of false notifications stretches
	// the gap between lookups: eight times VerifyEvery (2 s).
	verifyCap = 8
	// defaultSlack is how long past its Wait an heir's round may take
	// before the client gives up on it (Quiet.Slack's default).
	defaultSlack = 2 * time.Second
	// givenBackPause: a lock won and given back to a reservation is not
	// queued for again for this long.
	givenBackPause = 50 * time.Millisecond
	// refillOneIn: after a new leader's announcement one watcher in this
	// many polls soon, to take the heir slot the new leader freed.
	refillOneIn = 8
	// defaultSpread is Quiet.Spread's bound: four fifths of the default
	// deadlock_timeout, an heir's wait before waits could outlast it.
	defaultSpread = 800 * time.Millisecond
	// cancelAgain: a stopping heir's round that its cancel request did not
	// end within this long is ended by closing the connection.
	cancelAgain = time.Second
	// vacancySpread: after a vacancy announcement, watchers poll within
	// this long, at random, so that a fleet does not wake the server at
	// once.
	vacancySpread = 20 * time.Millisecond
)

// follower is a quiet session's campaign for its target: its role (an heir
// while it holds a slot, else a watcher), what the server proved of the
// leader, and the reservations it heeds. Its transitions are next (what to
// do now) and took (what a round's answer means).
type follower struct {
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
	// shortWait, when not zero, bounds the next heir's wait (see
	// Lease.ShortenWait).
	shortWait time.Duration

	// What the server proved of the holder, by a lookup in pg_locks (an
	// announcement only triggers one): its backend pid (0: unknown, or
	// nobody) and identity.
	leaderPID int32
	leader    string
	// verify: a notification says the leader may have changed; the lookup
	// runs at verifyAt at the earliest. A lookup that finds the holder it
	// knew (the notification was false) doubles verifyGap, up to verifyCap
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

// step is what a follower does next.
type step int

const (
	stepRound  step = iota // an heir's wait, or a watcher's poll
	stepLookup             // a holder lookup (a notification made one due)
	stepPause              // wait idle: a lock it won was reserved for another
	stepWatch              // a watcher waits idle for its next poll
)

// waiting reports whether the follower queues on the lock at now: an heir,
// or a candidate the leader named.
func (f *follower) waiting(now time.Time) bool { return f.heir >= 0 || now.Before(f.namedUntil) }

// next decides the follower's next step at now.
func (f *follower) next(now time.Time) step {
	named := now.Before(f.namedUntil)
	due := f.verify && !now.Before(f.verifyAt)
	switch {
	case now.Before(f.pauseUntil) && !named:
		return stepPause
	case due:
		return stepLookup
	case f.waiting(now), !now.Before(f.nextPoll):
		return stepRound
	default:
		return stepWatch
	}
}

// lease is the session's idle_session_timeout in ms while it holds a lock
// (nil: none).
func (f *follower) lease() *int32 {
	if f.Lease <= 0 {
		return nil
	}
	ms := int32(f.Lease.Milliseconds())
	return &ms
}

// took interprets a round's answer (the quiet functions' codes), sent at
// sent on the backend pid.
func (f *follower) took(code int32, sent time.Time, pid uint32) (Round, error) {
	rd := Round{Sent: sent}
	switch code {
	case codeWon:
		rd.Held, rd.Proven = true, true
	case codeHeld:
		rd.Held, rd.Already, rd.Proven = true, true, true
	case codeStandby:
		return rd, ErrStandby
	case codeForeign:
		return rd, fmt.Errorf("%w: the session's function ran on a backend other than the session's own (pid %d) or without its token", ErrTransactionPooling, pid)
	case codeBusy:
		rd.Busy = true
	case codeWoken:
		// A new leader ended the wait (pgleader_wake) before its
		// announcement committed: look it up in pg_locks now, or, when
		// the last lookup was less than VerifyEvery ago (a session of this
		// role could cancel the wait again and again), wait idle until
		// then, rather than queue for the lock again and look only at that
		// wait's end.
		rd.Busy, rd.Woken = true, true
		at := f.lastLookup.Add(f.VerifyEvery)
		if now := time.Now(); at.Before(now) {
			at = now
		}
		if !f.verify || at.Before(f.verifyAt) {
			f.verifyAt = at
		}
		f.verify, f.pauseUntil = true, f.verifyAt
	case codeReserved:
		// Won, and given back: a handover reserves the lock for another
		// candidate. Wait a little rather than win it again at once, and no
		// longer than ReservationBinds in all.
		rd.Busy = true
		now := time.Now()
		f.pauseUntil = now.Add(givenBackPause)
		if f.gateSince.IsZero() {
			f.gateSince = now
		} else if now.Sub(f.gateSince) > reservationBinds {
			f.gateOff = true
		}
	default:
		i := int(code) - codeSlot
		if i < 0 || i >= len(f.slots) || f.heir >= 0 {
			return rd, fmt.Errorf("pgleader: unexpected answer %d from the session's campaign function", code)
		}
		f.heir, rd.Busy = i, true
	}
	if rd.Held {
		f.heir = -1 // a win releases the slot
		f.namedUntil = time.Time{}
	}
	return rd, nil
}
