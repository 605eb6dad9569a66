package group

import (
	"cmp"
	"errors"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/leader"
)

// TestPlanMatchesReference checks plan against refPlan, the plan as it was
// before it walked the keys once (#31): every pass over the keys built a
// map, which was slow at 100,000 keys and plain to read. On random states
// (every phase, returned or not, past ReleaseTimeout or not; holds of
// this member and of another, running or expired; gifts; keys out of the
// set; leftovers and keys in doubt; stopping; light, full and scan rounds;
// members and ranks that change), both must decide the same actions.
func TestPlanMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 100000))
	for i := range 20000 {
		st, in := randomRound(r)
		want := normalized(refPlan(st, in))
		got := normalized(planPure(t, st, in))
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("state %d (scanned %v, full %v, stopping %v, rekey %v): plan and the reference differ\nplan      %+v\nreference %+v",
				i, in.scanned, in.full, st.stopping, st.rekey, got, want)
		}
	}
}

// randomRound builds a random state and what a round read.
func randomRound(r *rand.Rand) (*state, input) {
	pool := []string{"a", "b", "c", "d"}
	pick := func() []string {
		var out []string
		for _, m := range pool {
			if r.IntN(3) > 0 {
				out = append(out, m)
			}
		}
		return out
	}
	f := newFixture(1+r.IntN(24), "a", pick()...)
	st := f.st
	for _, k := range f.keys {
		if p := phase(r.IntN(4)); p != phaseFree {
			t := f.lead(k, p, r.IntN(2) == 0)
			if p == phaseHanding && r.IntN(2) == 0 {
				t.releaseAt = t0.Add(-time.Millisecond)
			}
		}
		ks := st.keys[k]
		switch r.IntN(6) {
		case 0:
			ks.hold = resignHold{member: "a", until: t0.Add(time.Second)}
		case 1:
			ks.hold = resignHold{member: "a", until: t0.Add(-time.Second)}
		case 2:
			ks.hold = resignHold{member: "b", until: t0.Add(time.Second)}
		case 3:
			ks.hold = resignHold{member: "c", until: t0.Add(-time.Second)}
		}
		ks.gift = r.IntN(4) == 0
	}
	if r.IntN(3) == 0 { // some keys leave the set
		set := map[tag]leader.Key{}
		for _, k := range f.keys {
			if r.IntN(4) > 0 {
				set[k] = st.keys[k].key
			}
		}
		st.setKeys(set)
		st.rekey = r.IntN(2) == 0
	}
	stranger := tagOf(leader.KeyFromName("plan/stranger")) // held, in no key state
	some := func() map[tag]bool {
		m := map[tag]bool{}
		for _, k := range append(slices.Clone(f.keys), stranger) {
			if r.IntN(4) == 0 {
				m[k] = true
			}
		}
		return m
	}
	st.extra, st.doubt = some(), some()
	st.stopping, st.dirty = r.IntN(5) == 0, r.IntN(3) == 0
	if r.IntN(3) == 0 {
		st.members = pick()
	}
	if r.IntN(4) == 0 {
		st.ranks = map[string]leader.Rank{"b": {Preference: leader.Preference{Priority: 1}}}
	}
	if r.IntN(3) == 0 {
		st.pending = []lockconn.GroupMessage{resignedMessage("a", f.keys[0], "b")}
	}
	in := input{now: t0, full: r.IntN(2) == 0}
	if in.full && r.IntN(2) == 0 {
		in.scanned = true
		in.held = some()
		for _, k := range f.keys { // most tenures still held
			if ks := st.keys[k]; ks != nil && ks.tenure != nil && r.IntN(4) > 0 {
				in.held[k] = true
			}
		}
		in.members = st.members
		if r.IntN(2) == 0 {
			in.members = pick()
		}
		if r.IntN(4) == 0 {
			in.ranks = map[string]leader.Rank{"c": {Preference: leader.Preference{Priority: 2}}}
		}
	}
	return st, in
}

// normalized sorts every list of a's (their order is unspecified).
func normalized(a actions) actions {
	for _, l := range []*[]tag{&a.lost, &a.expired, &a.selfHold, &a.unlock, &a.released, &a.overran, &a.adopt, &a.want, &a.keep} {
		*l = sorted(*l)
		if len(*l) == 0 {
			*l = nil
		}
	}
	slices.SortFunc(a.handOver, func(x, y handOver) int { return cmpTag(x.k, y.k) })
	for _, l := range []*[]lockconn.GroupMessage{&a.toSuccessors, &a.broadcast} {
		slices.SortFunc(*l, func(x, y lockconn.GroupMessage) int {
			return cmp.Or(cmpTag(x.Key, y.Key), cmp.Compare(x.Member, y.Member), cmp.Compare(x.To, y.To))
		})
		if len(*l) == 0 {
			*l = nil
		}
	}
	if len(a.handOver) == 0 {
		a.handOver = nil
	}
	return a
}

func cmpTag(a, b tag) int {
	return cmp.Or(cmp.Compare(a.C, b.C), cmp.Compare(a.O, b.O), cmp.Compare(a.S, b.S))
}

// refPlan is the plan before #31; see TestPlanMatchesReference.
func refPlan(st *state, in input) actions {
	var a actions
	held, members, ranks := in.held, in.members, in.ranks
	if !in.scanned {
		held, members, ranks = map[tag]bool{}, st.members, st.ranks
		for k, ks := range st.keys {
			if ks.phase == phaseLeading || ks.phase == phaseHanding {
				held[k] = true
			}
		}
		for k := range st.extra {
			held[k] = true
		}
	}
	// The keys go to the best-ranked members only (all of them when none
	// is ranked): the others stand by.
	members, _ = eligible(members, ranks)
	lost := map[tag]bool{}
	if in.scanned {
		for k, ks := range st.keys {
			if (ks.phase == phaseLeading || ks.phase == phaseHanding) && !held[k] {
				a.lost = append(a.lost, k)
				lost[k] = true
			}
		}
	}
	holds := map[tag]resignHold{}
	for k, ks := range st.keys {
		if h := ks.hold; h.set() {
			if in.now.After(h.until) {
				a.expired = append(a.expired, k)
			} else {
				holds[k] = h
			}
		}
	}
	a.broadcast = planBroadcast(st, in, members, holds) // the rewrite left it as it was
	mine := refPlanAssignment(st, in, members, holds, &a)
	for k, ks := range st.keys {
		if (ks.phase != phaseLeading && ks.phase != phaseHanding) || lost[k] {
			continue
		}
		refPlanTenure(st, in, k, ks, mine[k], holds, members, &a)
	}
	refPlanLeftovers(st, held, mine, &a)
	for k := range mine {
		if h, ok := holds[k]; ok && h.member == st.me {
			continue // resigned, or returned by itself: not taken back yet
		}
		if ks := st.keys[k]; !held[k] && ks.phase != phaseEnding && !lost[k] && (in.scanned || !st.doubt[k]) {
			a.want = append(a.want, k)
		}
	}
	return a
}

// refPlanLeftovers decides the locks held without a tenure (won in a round
// that failed after the grant, or by an exchange that met a full lock
// table): adopted when this member's and not ending, else released.
func refPlanLeftovers(st *state, held, mine map[tag]bool, a *actions) {
	unlocking := map[tag]bool{}
	for _, k := range a.unlock {
		unlocking[k] = true
	}
	for k := range held {
		ks := st.keys[k]
		if ks != nil && (ks.phase == phaseLeading || ks.phase == phaseHanding) || unlocking[k] {
			continue
		}
		if ks != nil && ks.phase == phaseEnding && ks.tenure != nil && !ks.tenure.returned() {
			a.keep = append(a.keep, k) // since 2026-12-05: a lapse's locks wait for OnElected
			continue
		}
		if mine[k] && (ks == nil || ks.phase != phaseEnding) {
			a.adopt = append(a.adopt, k)
		} else {
			a.unlock = append(a.unlock, k)
		}
	}
}

// refPlanAssignment assigns again when the keys or the members changed, and
// at a full round when the holds did; between, a round goes by the last
// assignment, plus the keys resigned to this member (a hand-over does not
// wait for an assignment). It returns the keys this member leads from
// now on: none once it stops.
func refPlanAssignment(st *state, in input, members []string, holds map[tag]resignHold, a *actions) map[tag]bool {
	mine := map[tag]bool{}
	if st.rekey || !slices.Equal(members, st.assigned) || in.full && (st.dirty || len(a.expired) > 0) {
		owner := assign(st.order, members, holds)
		a.assign = &assignment{owner: owner, members: members, mine: map[tag]bool{}}
		if me := slices.Index(members, st.me); me >= 0 {
			for i, o := range owner {
				if o == me {
					a.assign.mine[st.order[i]] = true
				}
			}
		}
		if st.stopping {
			return mine
		}
		for k := range a.assign.mine {
			mine[k] = true
		}
		return mine // an assignment clears the gifts
	}
	if st.stopping {
		return mine
	}
	for k, ks := range st.keys {
		if ks.mine || ks.gift && ks.inSet {
			mine[k] = true
		}
	}
	return mine
}

// refPlanTenure decides one tenure: hand it over when it is no longer this
// member's or its OnElected returned, and release it once handed over and
// done (or past ReleaseTimeout).
func refPlanTenure(st *state, in input, k tag, ks *keyState, mine bool, holds map[tag]resignHold, members []string, a *actions) {
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
	if h, ok := holds[k]; ok && h.member == st.me && errors.Is(reason, leader.ErrResigned) {
		a.toSuccessors = append(a.toSuccessors, resignedMessage(st.me, k, successorOf(k, members, st.me)))
	}
}
