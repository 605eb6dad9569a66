package group

import (
	"context"
	"time"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/leader"
)

// tag is a key as pg_locks shows it.
type tag = lockconn.Tag3

func tagOf(k leader.Key) tag {
	c, o, s := k.LockTag()
	return tag{C: c, O: o, S: s}
}

// phase is where a key is in this member's life of it (see the package
// doc's diagram). A key this member does not lead and may take is free;
// whether it is wanted is plan's to say, from the assignment.
type phase uint8

const (
	// phaseFree: no tenure, no lock kept (a lock held without a tenure,
	// won in a round that failed after the grant, is adopted or released
	// by the next full round).
	phaseFree phase = iota
	// phaseLeading: a tenure, OnElected running, the lock proven by the
	// last full round.
	phaseLeading
	// phaseHanding: a tenure being handed over gracefully (a resign, a
	// rebalance, a stop, OnElected returned): OnElected's context is
	// cancelled, and the lock stays held, and renewed, until it returns
	// (or ReleaseTimeout passes); then it is released.
	phaseHanding
	// phaseEnding: the tenure is over (released, or its lock lost) and
	// its OnDemoted has not run yet: the key is not taken again before.
	phaseEnding
)

func (p phase) String() string {
	return [...]string{"free", "leading", "handing over", "ending"}[p]
}

// keyState is one key as this member knows it. keys holds every key of the
// set, and every key with a tenure or an OnDemoted still to come.
type keyState struct {
	key    leader.Key
	inSet  bool // in the key set (SetKeys may take it out while it is led)
	phase  phase
	tenure *tenure
	// mine: the last assignment gives the key to this member.
	mine bool
	// gift: the key's owner resigned it to this member, which takes it
	// before the next assignment says so.
	gift bool
	// hold keeps a resigned key away from the member that resigned it for
	// a while (zero: none).
	hold resignHold
}

// resignHold keeps a resigned key away from the member that resigned it.
type resignHold struct {
	member string
	until  time.Time
}

func (h resignHold) set() bool { return h.member != "" }

// tenure is one key's tenure in this member, from the grant to OnDemoted.
type tenure struct {
	l         leader.Leadership
	ctx       context.Context // OnElected's
	cancel    context.CancelCauseFunc
	done      chan struct{} // OnElected returned
	reason    error         // why it is handed over, or ended
	releaseAt time.Time     // handing: past it, the lock is released even if OnElected runs on
	demoted   chan struct{} // closed after OnDemoted
}

// returned reports whether OnElected has returned.
func (t *tenure) returned() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

// state is what the member knows, under Group.mu. plan reads it and never
// writes it; the round applies plan's actions to it.
type state struct {
	me       string
	interval time.Duration // RenewInterval
	release  time.Duration // ReleaseTimeout
	keys     map[tag]*keyState
	// order is the set's keys in assignment order (see keyOrder); index a
	// key's place in it.
	order []tag
	index map[tag]int
	// The last assignment, kept while its inputs (keys, members, holds)
	// stay the same: owner[i] indexes assigned for order[i].
	owner    []int
	assigned []string
	rekey    bool // the keys changed: assign again now
	dirty    bool // the holds changed: assign again at the next full round
	// members and their main sessions' pids, as the last full round read
	// them: a group message is believed only from one of them.
	members  []string
	pids     map[uint32]string
	ranks    map[string]leader.Rank // the ranked members' ranks (see rank.go)
	stopping bool
	// pending are resigns told to their successors, for the whole group with
	// the next full round.
	pending  []lockconn.GroupMessage
	trustEnd time.Time // IsLeader is false past it
	// Between scans, what the session holds is known from its exchanges:
	// extra are locks it holds without a tenure (won, but not begun: a
	// term row was busy, or the key was no longer wanted), adopted or
	// released by the next round; doubt are keys an exchange that failed
	// may have won (a full lock table), never tried again before a scan
	// says whether they are held (a try on a key held stacks the lock,
	// and one unlock would no longer free it). A scan replaces both.
	extra, doubt map[tag]bool
}

// leftover records locks the session holds without a tenure.
func (st *state) leftover(ks ...tag) {
	if st.extra == nil {
		st.extra = map[tag]bool{}
	}
	for _, k := range ks {
		st.extra[k] = true
	}
}

// owns reports whether member owns k as this member sees it: the last
// assignment gives k to member (or to the member whose resign hands k to
// member), or member's own resign of k is held.
func (st *state) owns(k tag, member string) bool {
	if ks := st.keys[k]; ks != nil && ks.hold.member == member {
		return true
	}
	i, ok := st.index[k]
	if !ok || i >= len(st.owner) || st.owner[i] < 0 || st.owner[i] >= len(st.assigned) {
		return false
	}
	// Or the member a resign by the owner hands k to (successorOf): a key
	// resigned to a member and resigned again by it within one full round
	// reaches this member before its assignment has the first resign's
	// hold (the first resign was told to the successor alone).
	owner := st.assigned[st.owner[i]]
	return owner == member || successorOf(k, st.assigned, owner) == member
}

// setKeys replaces the key set: keys in it get a state, keys out of it keep
// theirs while they have a tenure or an OnDemoted to come.
func (st *state) setKeys(set map[tag]leader.Key) {
	for k, ks := range st.keys {
		if _, ok := set[k]; !ok {
			ks.inSet = false
			if ks.phase == phaseFree {
				delete(st.keys, k)
			}
		}
	}
	for k, key := range set {
		if ks := st.keys[k]; ks != nil {
			ks.inSet, ks.key = true, key
		} else {
			st.keys[k] = &keyState{key: key, inSet: true}
		}
	}
	st.order = keyOrder(set)
	st.index = make(map[tag]int, len(st.order))
	for i, k := range st.order {
		st.index[k] = i
	}
	st.rekey = true
}

// anyTenure reports whether some key has a tenure (leading or handing
// over): what a round asks before every round trip, which tenures() would
// answer by walking every key (5 % of a member's CPU at 100,000 keys).
func (st *state) anyTenure() bool {
	for _, ks := range st.keys {
		if ks.phase == phaseLeading || ks.phase == phaseHanding {
			return true
		}
	}
	return false
}

// anyKept reports whether the session keeps a lock whose key's OnElected
// still runs after its tenure ended (a lapse: see roundContext), which a
// leaving member must not free before it returns.
func (st *state) anyKept() bool {
	for k := range st.extra {
		if ks := st.keys[k]; ks != nil && ks.phase == phaseEnding && ks.tenure != nil && !ks.tenure.returned() {
			return true
		}
	}
	return false
}

// tenures counts the keys with a tenure (leading or handing over).
func (st *state) tenures() int {
	n := 0
	for _, ks := range st.keys {
		if ks.phase == phaseLeading || ks.phase == phaseHanding {
			n++
		}
	}
	return n
}
