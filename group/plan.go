package group

import (
	"errors"
	"slices"
	"time"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/leader"
)

// input is what a round read before it plans.
type input struct {
	now time.Time
	// full: the round proved the session (the trust window renews);
	// scanned: it also scanned pg_locks.
	full, scanned bool
	// held and members are a scan's: the keys this backend holds (proven
	// by their locks), and the members. A round that did not scan goes by
	// the tenures (the session proven, their locks are: see
	// docs/groups.md, "What a round proves") and the last members.
	held    map[tag]bool
	members []string
	ranks   map[string]leader.Rank // the ranked members' (see rank.go)
}

// actions are what a round does: plan decides them, the round applies
// them to the state and does the I/O.
type actions struct {
	// lost: a full round found these tenures' locks gone: each ends alone,
	// with ErrLockLost.
	lost []tag
	// expired: resign holds past their time, dropped.
	expired []tag
	// assign: a new assignment (nil: keep the last one).
	assign *assignment
	// handOver: tenures to hand over gracefully, each with its reason
	// (OnElected's context is cancelled; the lock stays until it returns).
	handOver []handOver
	// selfHold: tenures whose OnElected returned by itself: the key is kept
	// from this member for one interval.
	selfHold []tag
	// unlock: locks to release; released: the tenures among them, which
	// end (OnDemoted) once they are; overran: those released while
	// OnElected still runs, past ReleaseTimeout.
	unlock, released, overran []tag
	// toSuccessors: resigns to tell, each to the member that gets the key;
	// broadcast: resigns to tell the whole group (pending ones, and this
	// member's held resigns when the members changed).
	toSuccessors, broadcast []lockconn.GroupMessage
	// adopt: locks held without a tenure (won in a round that failed
	// after the grant) that are this member's: led from now on.
	adopt []tag
	// keep: locks held without a tenure whose key's OnElected still runs
	// (a trust window that lapsed ended the tenure, and a late answer kept
	// the session): neither released nor adopted before it returns.
	keep []tag
	// want: free keys of this member's, tried in the exchange.
	want []tag
}

type handOver struct {
	k      tag
	reason error
}

// assignment is the assignment of the set's keys to the members (the
// eligible ones: see rank.go).
type assignment struct {
	owner   []int
	members []string
	mine    map[tag]bool
}

// plan decides a round, a pure function of the state and what the round
// read: it never writes st. (It ranges over maps: the order of each list
// in actions is unspecified.) A round that scanned proves every tenure by
// its lock (a key whose lock is gone is lost); a full round expires holds,
// assigns again when the keys, the members or the holds changed, hands
// over what is no longer this member's, releases what is handed over and
// done, and takes what is this member's and free. A round that did not
// scan goes by the tenures as held and the last members; a light round
// also keeps the holds and the pending resigns for the next full round.
//
// Its cost is one walk of the keys, reading each key's state in place (no
// map is built per key: see BenchmarkPlan), plus the scan's held keys when
// it scanned; a full round, or one that assigns again, first walks the
// keys for their holds.
func plan(st *state, in input) actions {
	var a actions
	members, ranks := in.members, in.ranks
	if !in.scanned {
		members, ranks = st.members, st.ranks
	}
	// The keys go to the best-ranked members only (all of them when none
	// is ranked): the others stand by.
	members, _ = eligible(members, ranks)
	// A light round that keeps the last assignment (every round of a
	// resign) needs no list of the holds: its walk drops the expired ones.
	// Any round that may assign again has it (planAssignment's condition
	// holds only where listed does).
	var holds map[tag]resignHold
	listed := in.full || st.rekey || !slices.Equal(members, st.assigned)
	if listed {
		holds = planHolds(st, in, &a)
	}
	a.broadcast = planBroadcast(st, in, members, holds)
	mine := planAssignment(st, in, members, holds, &a)
	for k, ks := range st.keys {
		if h := ks.hold; !listed && h.set() && in.now.After(h.until) {
			a.expired = append(a.expired, k)
		}
		tenured := ks.phase == phaseLeading || ks.phase == phaseHanding
		switch held := isHeld(st, in, k, ks); {
		case tenured && !held:
			// Only a scan says a tenure's lock is gone: the key is lost.
			a.lost = append(a.lost, k)
		case tenured:
			planTenure(st, in, k, ks, mine.of(k, ks), members, &a)
		case mine.of(k, ks) && !held && ks.phase != phaseEnding && (in.scanned || !st.doubt[k]):
			if h, ok := activeHold(ks, in.now); ok && h.member == st.me {
				continue // resigned, or returned by itself: not taken back yet
			}
			a.want = append(a.want, k)
		}
	}
	planLeftovers(st, in, mine, &a)
	return a
}

// isHeld reports whether the session holds k's lock: as the scan found
// it, or, between scans, by its tenure or as a lock won without one (see
// state.extra).
func isHeld(st *state, in input, k tag, ks *keyState) bool {
	if in.scanned {
		return in.held[k]
	}
	return ks.phase == phaseLeading || ks.phase == phaseHanding || st.extra[k]
}

// activeHold returns k's resign hold unless there is none or it expired.
func activeHold(ks *keyState, now time.Time) (resignHold, bool) {
	h := ks.hold
	return h, h.set() && !now.After(h.until)
}

// planHolds returns the resign holds still running (nil when none), and
// puts those past their time in a.expired.
func planHolds(st *state, in input, a *actions) map[tag]resignHold {
	var holds map[tag]resignHold
	for k, ks := range st.keys {
		switch h, ok := activeHold(ks, in.now); {
		case ok:
			if holds == nil {
				holds = map[tag]resignHold{}
			}
			holds[k] = h
		case h.set():
			a.expired = append(a.expired, k)
		}
	}
	return holds
}

// planLeftovers decides the locks held without a tenure (won in a round
// that failed after the grant, or by an exchange that met a full lock
// table, or kept after a lapse): adopted when this member's and not
// ending, kept while an ended tenure's OnElected still runs on it (see
// roundContext), else released. A scan lists them among the keys held;
// between scans they are st.extra.
func planLeftovers(st *state, in input, mine ownership, a *actions) {
	held := st.extra
	if in.scanned {
		held = in.held
	}
	for k := range held {
		ks := st.keys[k]
		if ks != nil && (ks.phase == phaseLeading || ks.phase == phaseHanding) {
			continue // a tenure: planTenure's
		}
		if ks != nil && ks.phase == phaseEnding && ks.tenure != nil && !ks.tenure.returned() {
			a.keep = append(a.keep, k) // released before it returns, another member could lead it meanwhile
			continue
		}
		if ks != nil && mine.of(k, ks) && ks.phase != phaseEnding {
			a.adopt = append(a.adopt, k)
		} else {
			a.unlock = append(a.unlock, k)
		}
	}
}

// planBroadcast: a full round tells the group of the resigns told to their
// successors alone; and when the members changed, of this member's resigns
// still held (a member that joined since has not heard of them, and would
// assign those keys back to this member, which would not take them).
func planBroadcast(st *state, in input, members []string, holds map[tag]resignHold) []lockconn.GroupMessage {
	if !in.full {
		return nil
	}
	out := slices.Clone(st.pending)
	if slices.Equal(members, st.assigned) {
		return out
	}
	for k, h := range holds {
		if h.member == st.me {
			if next := successorOf(k, members, st.me); next != "" {
				out = append(out, resignedMessage(st.me, k, next))
			}
		}
	}
	return out
}

// ownership says which keys this member leads from now on: a new
// assignment's, or the last assignment's plus the keys resigned to this
// member (as each key's state has them); none once it stops.
type ownership struct {
	none bool
	// assigned: a new assignment, whose keys of this member are mine;
	// else the key states say.
	assigned bool
	mine     map[tag]bool
}

func (o ownership) of(k tag, ks *keyState) bool {
	switch {
	case o.none:
		return false
	case o.assigned:
		return o.mine[k]
	default:
		return ks.mine || ks.gift && ks.inSet
	}
}

// planAssignment assigns again when the keys or the members changed, and
// at a full round when the holds did; between, a round goes by the last
// assignment, plus the keys resigned to this member (a hand-over does not
// wait for an assignment). It returns the keys this member leads from
// now on: none once it stops.
func planAssignment(st *state, in input, members []string, holds map[tag]resignHold, a *actions) ownership {
	if st.rekey || !slices.Equal(members, st.assigned) || in.full && (st.dirty || len(a.expired) > 0) {
		owner := assign(st.order, members, holds)
		a.assign = &assignment{owner: owner, members: members, mine: map[tag]bool{}}
		if me := slices.Index(members, st.me); me >= 0 {
			a.assign.mine = make(map[tag]bool, len(owner)/len(members)+1) // about its share
			for i, o := range owner {
				if o == me {
					a.assign.mine[st.order[i]] = true
				}
			}
		}
		// An assignment clears the gifts.
		return ownership{none: st.stopping, assigned: true, mine: a.assign.mine}
	}
	return ownership{none: st.stopping}
}

// planTenure decides one tenure: hand it over when it is no longer this
// member's or its OnElected returned, and release it once handed over and
// done (or past ReleaseTimeout).
func planTenure(st *state, in input, k tag, ks *keyState, mine bool, members []string, a *actions) {
	t := ks.tenure
	handing, reason, releaseAt := ks.phase == phaseHanding, t.reason, t.releaseAt
	returned := t.returned()
	switch {
	case !handing && !mine:
		handing, reason, releaseAt = true, leader.ErrResigned, in.now.Add(st.release)
		a.handOver = append(a.handOver, handOver{k, reason})
	case !handing && returned:
		// OnElected returned by itself: hand over.
		handing, reason, releaseAt = true, leader.ErrCallbackReturned, in.now.Add(st.release)
		a.handOver = append(a.handOver, handOver{k, reason})
		a.selfHold = append(a.selfHold, k)
	}
	if !handing || !returned && in.now.Before(releaseAt) {
		return
	}
	if !returned {
		a.overran = append(a.overran, k)
	}
	a.unlock = append(a.unlock, k)
	a.released = append(a.released, k)
	if h, ok := activeHold(ks, in.now); ok && h.member == st.me && errors.Is(reason, leader.ErrResigned) {
		a.toSuccessors = append(a.toSuccessors, resignedMessage(st.me, k, successorOf(k, members, st.me)))
	}
}

// resignedMessage tells the group that member resigned k to its successor.
func resignedMessage(member string, k tag, successor string) lockconn.GroupMessage {
	return lockconn.GroupMessage{Kind: lockconn.GroupResigned, Member: member, Key: k, To: successor}
}
