package group

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/leader"
)

// The plan step, table-tested: plan is a pure function of the state and
// what a round read, so each row builds a state, runs plan, and checks
// the actions, for every phase transition of a key and every side state
// (resign holds, gifts, adopted locks, a full lock table's leftovers).

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// fixture is a state with keys k0..k(n-1), the given members and an
// assignment already made for them (so that nothing is assigned again
// unless a row says so).
type fixture struct {
	st   *state
	keys []tag
}

func newFixture(n int, me string, members ...string) *fixture {
	f := &fixture{st: &state{me: me, interval: time.Second, release: 5 * time.Second, keys: map[tag]*keyState{}}}
	set := map[tag]leader.Key{}
	for i := range n {
		k := leader.KeyFromName(fmt.Sprintf("plan/%d", i))
		set[tagOf(k)] = k
		f.keys = append(f.keys, tagOf(k))
	}
	f.st.setKeys(set)
	f.st.members = members
	f.assign(members)
	return f
}

// assign makes the assignment for members current, as a round would.
func (f *fixture) assign(members []string) {
	st := f.st
	holds := map[tag]resignHold{}
	for k, ks := range st.keys {
		if ks.hold.set() {
			holds[k] = ks.hold
		}
	}
	st.owner, st.assigned, st.rekey, st.dirty = assign(st.order, members, holds), members, false, false
	me := slices.Index(members, st.me)
	for i, o := range st.owner {
		st.keys[st.order[i]].mine = o == me && me >= 0
	}
}

// mine and theirs are the keys the assignment gives to this member and
// to another.
func (f *fixture) mine() []tag   { return f.filter(true) }
func (f *fixture) theirs() []tag { return f.filter(false) }
func (f *fixture) filter(mine bool) []tag {
	var out []tag
	for _, k := range f.keys {
		if f.st.keys[k].mine == mine {
			out = append(out, k)
		}
	}
	return out
}

// lead gives k a tenure in phase p; returned closes its OnElected.
func (f *fixture) lead(k tag, p phase, returned bool) *tenure {
	t := &tenure{cancel: func(error) {}, done: make(chan struct{}), demoted: make(chan struct{})}
	if returned {
		close(t.done)
	}
	if p == phaseHanding {
		t.reason, t.releaseAt = leader.ErrResigned, t0.Add(5*time.Second)
	}
	ks := f.st.keys[k]
	ks.phase, ks.tenure = p, t
	return t
}

// held is the scan of a full round that proves keys.
func held(keys ...tag) map[tag]bool {
	m := map[tag]bool{}
	for _, k := range keys {
		m[k] = true
	}
	return m
}

func sorted(ts []tag) []tag {
	out := slices.Clone(ts)
	slices.SortFunc(out, func(a, b tag) int {
		switch {
		case a.C != b.C:
			return int(int64(a.C) - int64(b.C))
		case a.O != b.O:
			return int(int64(a.O) - int64(b.O))
		}
		return int(a.S) - int(b.S)
	})
	return out
}

func same(t *testing.T, what string, got, want []tag) {
	t.Helper()
	if len(got) == 0 && len(want) == 0 {
		return
	}
	if !reflect.DeepEqual(sorted(got), sorted(want)) {
		t.Errorf("%s: got %v, want %v", what, sorted(got), sorted(want))
	}
}

// planPure runs plan and checks that it wrote nothing to the state.
func planPure(t *testing.T, st *state, in input) actions {
	t.Helper()
	before := snapshotOf(st)
	a := plan(st, in)
	if after := snapshotOf(st); !reflect.DeepEqual(before, after) {
		t.Fatalf("plan wrote to the state:\nbefore %+v\nafter  %+v", before, after)
	}
	return a
}

// snapshotOf copies what plan may read, by value.
func snapshotOf(st *state) map[string]any {
	keys := map[tag]keyState{}
	for k, ks := range st.keys {
		keys[k] = *ks
	}
	return map[string]any{"keys": keys, "owner": slices.Clone(st.owner), "assigned": slices.Clone(st.assigned),
		"rekey": st.rekey, "dirty": st.dirty, "members": slices.Clone(st.members), "stopping": st.stopping,
		"pending": slices.Clone(st.pending), "trustEnd": st.trustEnd, "order": slices.Clone(st.order), "index": maps.Clone(st.index),
		"ranks": maps.Clone(st.ranks)}
}

// A free key of this member's is wanted; one of another member's is not.
// free -> wanted (and, once won, leading: the round begins it).
func TestPlanWantsItsFreeKeys(t *testing.T) {
	f := newFixture(8, "a", "a", "b")
	a := planPure(t, f.st, input{now: t0, full: true, scanned: true, held: held(), members: []string{"a", "b"}})
	same(t, "want", a.want, f.mine())
	if a.assign != nil || len(a.unlock)+len(a.adopt)+len(a.handOver) != 0 {
		t.Fatalf("a standing round with nothing led: %+v", a)
	}
}

// leading -> leading: a key proven held and still this member's needs
// nothing; it is neither wanted nor released.
func TestPlanKeepsWhatItLeads(t *testing.T) {
	f := newFixture(8, "a", "a", "b")
	for _, k := range f.mine() {
		f.lead(k, phaseLeading, false)
	}
	a := planPure(t, f.st, input{now: t0, full: true, scanned: true, held: held(f.mine()...), members: []string{"a", "b"}})
	if len(a.want)+len(a.unlock)+len(a.handOver)+len(a.lost)+len(a.adopt) != 0 {
		t.Fatalf("a steady round: %+v", a)
	}
}

// leading -> ending: a full round that does not find a tenure's lock (an
// unlock on the session, a reset) loses that key alone, and does not want
// it back in the same round.
func TestPlanLosesAKeyWhoseLockIsGone(t *testing.T) {
	f := newFixture(8, "a", "a", "b")
	mine := f.mine()
	for _, k := range mine {
		f.lead(k, phaseLeading, false)
	}
	a := planPure(t, f.st, input{now: t0, full: true, scanned: true, held: held(mine[1:]...), members: []string{"a", "b"}})
	same(t, "lost", a.lost, mine[:1])
	same(t, "want", a.want, nil)
	same(t, "unlock", a.unlock, nil)
}

// A light round proves nothing, so it loses nothing: the tenures count as
// held.
func TestPlanLightRoundLosesNothing(t *testing.T) {
	f := newFixture(8, "a", "a", "b")
	for _, k := range f.mine() {
		f.lead(k, phaseLeading, false)
	}
	a := planPure(t, f.st, input{now: t0, full: false})
	if len(a.lost)+len(a.want)+len(a.unlock) != 0 {
		t.Fatalf("a light round: %+v", a)
	}
}

// leading -> handing over: a member joined, and keys the new assignment
// gives it are handed over gracefully (not released yet: OnElected runs).
func TestPlanHandsOverWhatAJoinTakes(t *testing.T) {
	f := newFixture(12, "a", "a")
	for _, k := range f.keys {
		f.lead(k, phaseLeading, false)
	}
	a := planPure(t, f.st, input{now: t0, full: true, scanned: true, held: held(f.keys...), members: []string{"a", "b"}})
	if a.assign == nil {
		t.Fatal("the members changed and nothing was assigned again")
	}
	var gone []tag
	for _, k := range f.keys {
		if !a.assign.mine[k] {
			gone = append(gone, k)
		}
	}
	if len(gone) != 6 {
		t.Fatalf("%d keys move to the new member, want 6", len(gone))
	}
	var handed []tag
	for _, h := range a.handOver {
		if !errors.Is(h.reason, leader.ErrResigned) {
			t.Errorf("handed over with %v, want ErrResigned", h.reason)
		}
		handed = append(handed, h.k)
	}
	same(t, "handOver", handed, gone)
	same(t, "unlock", a.unlock, nil) // OnElected still runs
}

// handing over -> ending: once its OnElected returned, a handed-over key
// is released (and ends with the exchange); before, it is kept.
func TestPlanReleasesWhenOnElectedReturned(t *testing.T) {
	for _, returned := range []bool{false, true} {
		f := newFixture(4, "a", "a", "b")
		k := f.mine()[0]
		f.lead(k, phaseHanding, returned)
		a := planPure(t, f.st, input{now: t0, full: true, scanned: true, held: held(k), members: []string{"a", "b"}})
		if returned {
			same(t, "unlock", a.unlock, []tag{k})
			same(t, "released", a.released, []tag{k})
		} else {
			same(t, "unlock", a.unlock, nil)
		}
		same(t, "overran", a.overran, nil)
		if slices.Contains(a.want, k) {
			t.Fatal("a key still held is wanted")
		}
	}
}

// handing over -> ending past ReleaseTimeout: the lock is released though
// OnElected still runs, and that is reported.
func TestPlanReleasesPastReleaseTimeout(t *testing.T) {
	f := newFixture(4, "a", "a", "b")
	k := f.mine()[0]
	f.lead(k, phaseHanding, false)
	a := planPure(t, f.st, input{now: t0.Add(6 * time.Second), full: true, scanned: true, held: held(k), members: []string{"a", "b"}})
	same(t, "unlock", a.unlock, []tag{k})
	same(t, "overran", a.overran, []tag{k})
}

// leading -> handing over, by itself: an OnElected that returned hands its
// key over, and holds it back from this member for one interval.
func TestPlanHandsOverWhenOnElectedReturns(t *testing.T) {
	f := newFixture(4, "a", "a", "b")
	k := f.mine()[0]
	f.lead(k, phaseLeading, true)
	a := planPure(t, f.st, input{now: t0, full: true, scanned: true, held: held(k), members: []string{"a", "b"}})
	if len(a.handOver) != 1 || a.handOver[0].k != k || !errors.Is(a.handOver[0].reason, leader.ErrCallbackReturned) {
		t.Fatalf("handOver %+v, want %v with ErrCallbackReturned", a.handOver, k)
	}
	same(t, "selfHold", a.selfHold, []tag{k})
	same(t, "unlock", a.unlock, []tag{k}) // returned already: released this round
	if len(a.toSuccessors) != 0 {
		t.Fatalf("a returned OnElected tells successors %v; only a resign does", a.toSuccessors)
	}
}

// ending: a key whose OnDemoted has not run is neither wanted nor adopted,
// though it is this member's and free.
func TestPlanWaitsForOnDemoted(t *testing.T) {
	f := newFixture(4, "a", "a", "b")
	k := f.mine()[0]
	f.lead(k, phaseEnding, true)
	a := planPure(t, f.st, input{now: t0, full: true, scanned: true, held: held(), members: []string{"a", "b"}})
	if slices.Contains(a.want, k) {
		t.Fatal("an ending key is wanted")
	}
	// Held again (won in a round that failed after the grant): released,
	// not adopted, while it ends.
	a = planPure(t, f.st, input{now: t0, full: true, scanned: true, held: held(k), members: []string{"a", "b"}})
	same(t, "adopt", a.adopt, nil)
	same(t, "unlock", a.unlock, []tag{k})
}

// adopted: a lock held without a tenure (won in a round that failed after
// the grant, or an exchange that met a full lock table) is adopted when
// it is this member's, and released when it is not.
func TestPlanAdoptsOrReleasesLeftovers(t *testing.T) {
	f := newFixture(8, "a", "a", "b")
	m, o := f.mine()[0], f.theirs()[0]
	foreign := tag{C: 1, O: 2, S: 2} // not in the set at all
	a := planPure(t, f.st, input{now: t0, full: true, scanned: true, held: held(m, o, foreign), members: []string{"a", "b"}})
	same(t, "adopt", a.adopt, []tag{m})
	same(t, "unlock", a.unlock, []tag{o, foreign})
	if slices.Contains(a.want, m) {
		t.Fatal("an adopted key is also wanted")
	}
}

// resign-held: a key this member resigned is handed over, its successor is told,
// and it is not wanted back while the hold lasts; once it expires it is
// assigned (and wanted) again.
func TestPlanResignHold(t *testing.T) {
	f := newFixture(8, "a", "a", "b")
	k := f.mine()[0]
	f.lead(k, phaseHanding, true)
	f.st.keys[k].hold = resignHold{member: "a", until: t0.Add(10 * time.Second)}
	f.st.dirty = true
	a := planPure(t, f.st, input{now: t0, full: true, scanned: true, held: held(k), members: []string{"a", "b"}})
	same(t, "unlock", a.unlock, []tag{k})
	if len(a.toSuccessors) != 1 || a.toSuccessors[0].To != "b" || a.toSuccessors[0].Key != k || a.toSuccessors[0].Kind != lockconn.GroupResigned {
		t.Fatalf("successors %+v, want a resign of %v to b", a.toSuccessors, k)
	}
	if a.assign == nil || a.assign.mine[k] {
		t.Fatalf("the hold does not move the key: %+v", a.assign)
	}
	// The hold moves that key only: every other key stays where it was.
	for _, other := range f.keys {
		if other != k && a.assign.mine[other] != f.st.keys[other].mine {
			t.Fatalf("a resign of %v moved %v too", k, other)
		}
	}
	// Past the hold: expired, assigned again, wanted.
	f2 := newFixture(8, "a", "a", "b")
	k2 := f2.mine()[0]
	f2.st.keys[k2].hold = resignHold{member: "a", until: t0.Add(-time.Millisecond)}
	a = planPure(t, f2.st, input{now: t0, full: true, scanned: true, held: held(), members: []string{"a", "b"}})
	same(t, "expired", a.expired, []tag{k2})
	if a.assign == nil || !a.assign.mine[k2] || !slices.Contains(a.want, k2) {
		t.Fatalf("an expired hold: assign %+v, want %v", a.assign, a.want)
	}
}

// A hold not yet expired keeps the key from being wanted even when the
// assignment still gives it to this member (a light round, before the
// next full one assigns again).
func TestPlanHoldBlocksWantBeforeReassign(t *testing.T) {
	f := newFixture(8, "a", "a", "b")
	k := f.mine()[0]
	f.st.keys[k].hold = resignHold{member: "a", until: t0.Add(time.Second)}
	a := planPure(t, f.st, input{now: t0, full: false})
	if slices.Contains(a.want, k) {
		t.Fatal("a held-back key is wanted")
	}
}

// A light round that assigns again (the keys changed) keeps a running
// resign hold: the key stays away from the member that resigned it, which
// would not take it back (it would go unled until the hold expired).
func TestPlanLightRoundAssignsWithHolds(t *testing.T) {
	f := newFixture(8, "a", "a", "b")
	k := f.mine()[0]
	f.st.keys[k].hold = resignHold{member: "a", until: t0.Add(time.Second)}
	set := map[tag]leader.Key{}
	for _, key := range f.keys {
		set[key] = f.st.keys[key].key
	}
	extra := leader.KeyFromName("plan/extra")
	set[tagOf(extra)] = extra
	f.st.setKeys(set)
	a := planPure(t, f.st, input{now: t0})
	if a.assign == nil {
		t.Fatal("the keys changed, no assignment")
	}
	if a.assign.mine[k] {
		t.Fatalf("a light round's assignment gives %v back to the member whose resign of it is held", k)
	}
	if slices.Contains(a.want, k) || len(a.expired) != 0 {
		t.Fatalf("want %v, expired %v: the held key is wanted or its hold expired", a.want, a.expired)
	}
}

// gift: a key resigned to this member is taken at once, before an
// assignment gives it; an assignment clears gifts.
func TestPlanTakesGifts(t *testing.T) {
	f := newFixture(8, "a", "a", "b")
	k := f.theirs()[0]
	f.st.keys[k].gift = true
	a := planPure(t, f.st, input{now: t0, full: false})
	if !slices.Contains(a.want, k) {
		t.Fatalf("want %v, missing the gift %v", a.want, k)
	}
	// A gift of a key no longer in the set is not taken.
	f.st.keys[k].inSet = false
	if a = planPure(t, f.st, input{now: t0, full: false}); slices.Contains(a.want, k) {
		t.Fatal("a gift out of the set is wanted")
	}
}

// Stopping: every tenure is handed over, nothing is wanted or adopted.
func TestPlanStopping(t *testing.T) {
	f := newFixture(8, "a", "a", "b")
	for _, k := range f.mine() {
		f.lead(k, phaseLeading, false)
	}
	f.st.stopping = true
	a := planPure(t, f.st, input{now: t0, full: true, scanned: true, held: held(f.mine()...), members: []string{"a", "b"}})
	if len(a.handOver) != len(f.mine()) || len(a.want)+len(a.adopt) != 0 {
		t.Fatalf("stopping: %+v", a)
	}
}

// Keys that leave the set (SetKeys) are handed over; keys that join it
// are assigned at once (rekey), not at the next full round.
func TestPlanSetKeys(t *testing.T) {
	f := newFixture(8, "a", "a", "b")
	mine := f.mine()
	for _, k := range mine {
		f.lead(k, phaseLeading, false)
	}
	set := map[tag]leader.Key{}
	for _, k := range f.keys {
		if k != mine[0] {
			set[k] = f.st.keys[k].key
		}
	}
	f.st.setKeys(set)
	a := planPure(t, f.st, input{now: t0, full: false})
	if a.assign == nil {
		t.Fatal("new keys, no assignment")
	}
	found := false
	for _, h := range a.handOver {
		found = found || h.k == mine[0]
	}
	if !found {
		t.Fatalf("the key that left the set is not handed over: %+v", a.handOver)
	}
}

// Members changed: this member's held resigns are told to the whole group
// again (a member that joined since would assign them back), and the
// pending resigns go out with the full round.
func TestPlanBroadcastsHeldResignsToNewMembers(t *testing.T) {
	f := newFixture(8, "a", "a", "b")
	k := f.mine()[0]
	f.st.keys[k].hold = resignHold{member: "a", until: t0.Add(10 * time.Second)}
	f.st.pending = []lockconn.GroupMessage{{Kind: lockconn.GroupResigned, Member: "a", Key: f.keys[1], To: "b"}}
	a := planPure(t, f.st, input{now: t0, full: true, scanned: true, held: held(), members: []string{"a", "b", "c"}})
	if len(a.broadcast) != 2 {
		t.Fatalf("broadcast %+v, want the pending resign and the held one", a.broadcast)
	}
	// A light round broadcasts nothing.
	if a = planPure(t, f.st, input{now: t0, full: false}); len(a.broadcast) != 0 {
		t.Fatalf("a light round broadcast %+v", a.broadcast)
	}
}

// A member alone: everything is its own; a member the roster does not
// list (not joined yet) leads nothing.
func TestPlanMembership(t *testing.T) {
	f := newFixture(6, "a", "a")
	a := planPure(t, f.st, input{now: t0, full: true, scanned: true, held: held(), members: []string{"a"}})
	same(t, "want", a.want, f.keys)
	f2 := newFixture(6, "a", "b")
	a = planPure(t, f2.st, input{now: t0, full: true, scanned: true, held: held(), members: []string{"b"}})
	same(t, "want", a.want, nil)
}

// A resign is believed from the key's owner, and from the member a resign
// by the owner hands the key to (a key resigned twice within one full
// round: the second resign comes before this member's assignment knows of
// the first); from no other member.
func TestOwnsAcceptsTheOwnersSuccessor(t *testing.T) {
	f := newFixture(8, "a", "a", "b", "c")
	for _, k := range f.keys {
		owner := f.st.assigned[f.st.owner[f.st.index[k]]]
		next := successorOf(k, f.st.assigned, owner)
		for _, m := range []string{"a", "b", "c"} {
			want := m == owner || m == next
			if got := f.st.owns(k, m); got != want {
				t.Errorf("owns(%v, %s) = %v, want %v (owner %s, its successor %s)", k, m, got, want, owner, next)
			}
		}
	}
}

// anyTenure is tenures() > 0, for every phase a key can be in.
func TestAnyTenure(t *testing.T) {
	for _, phases := range [][]phase{
		{}, {phaseFree}, {phaseEnding}, {phaseFree, phaseEnding},
		{phaseLeading}, {phaseHanding}, {phaseFree, phaseEnding, phaseHanding}, {phaseEnding, phaseLeading, phaseFree},
	} {
		st := &state{keys: map[tag]*keyState{}}
		for i, p := range phases {
			st.keys[tag{C: 1, O: uint32(i), S: 2}] = &keyState{phase: p}
		}
		if got, want := st.anyTenure(), st.tenures() > 0; got != want {
			t.Errorf("phases %v: anyTenure %v, want %v", phases, got, want)
		}
		if want := slices.Contains(phases, phaseLeading) || slices.Contains(phases, phaseHanding); st.anyTenure() != want {
			t.Errorf("phases %v: anyTenure %v, want %v", phases, st.anyTenure(), want)
		}
	}
}

// BenchmarkPlan is one round's plan for a member of three that leads its
// share of n keys: a light round (a resign's, on both sides of the
// hand-over), and a full round just after another member was reported
// gone (a failover: every key is assigned again, to two members).
func BenchmarkPlan(b *testing.B) {
	for _, n := range []int{1000, 100000} {
		f := newFixture(n, "b", "a", "b", "c")
		for _, k := range f.mine() {
			f.lead(k, phaseLeading, false)
		}
		b.Run(fmt.Sprintf("light/keys=%d", n), func(b *testing.B) {
			in := input{now: t0}
			for b.Loop() {
				plan(f.st, in)
			}
		})
		b.Run(fmt.Sprintf("gone/keys=%d", n), func(b *testing.B) {
			in := input{now: t0, full: true}
			f.st.members = []string{"a", "b"}
			defer func() { f.st.members = []string{"a", "b", "c"} }()
			for b.Loop() {
				plan(f.st, in)
			}
		})
	}
}
