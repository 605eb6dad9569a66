package group

import (
	"cmp"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pgleader/pgleader/leader"
)

// BenchmarkOwned is Owned and Status for a member that leads a third of
// 100,000 keys: what a health probe or a metrics scrape costs. Owned sorted
// the keys by a string built per comparison with the group's lock held
// (123 ms, 78 MB, its rounds waiting meanwhile); it now sorts them by lock
// tag after releasing it, and Status counts them without the list.
func BenchmarkOwned(b *testing.B) {
	g := &Group{}
	g.st.keys = map[tag]*keyState{}
	for i := range 33334 {
		key := leader.KeyFromName(fmt.Sprint("tenant-", i))
		g.st.keys[tagOf(key)] = &keyState{key: key, phase: phaseLeading}
	}
	g.st.trustEnd = time.Now().Add(time.Hour)
	b.Run("Owned", func(b *testing.B) {
		for b.Loop() {
			g.Owned()
		}
	})
	b.Run("Status", func(b *testing.B) {
		for b.Loop() {
			g.Status()
		}
	})
}

// Owned lists the keys this member leads, in lock order (not by name), and
// nothing once the trust window closed; Status counts the same keys.
func TestOwnedInLockOrder(t *testing.T) {
	g := &Group{}
	g.st.keys = map[tag]*keyState{}
	var want []leader.Key
	for i, name := range []string{"zeta", "alpha", "mid", "beta", "omega", "gamma"} {
		key := leader.KeyFromName(name)
		ph := phaseLeading
		if i%3 == 2 {
			ph = phaseHanding // handed over: not led
		}
		g.st.keys[tagOf(key)] = &keyState{key: key, phase: ph}
		if ph == phaseLeading {
			want = append(want, key)
		}
	}
	pair := leader.PairKey(1, 2)
	g.st.keys[tagOf(pair)] = &keyState{key: pair, phase: phaseLeading}
	want = append(want, pair)
	slices.SortFunc(want, func(a, b leader.Key) int {
		ac, ao, as := a.LockTag()
		bc, bo, bs := b.LockTag()
		return cmp.Or(cmp.Compare(ac, bc), cmp.Compare(ao, bo), cmp.Compare(as, bs))
	})
	g.st.trustEnd = time.Now().Add(time.Hour)
	if got := g.Owned(); !slices.Equal(got, want) {
		t.Fatalf("Owned: %v, want %v", got, want)
	}
	if n := g.Status().Owned; n != len(want) {
		t.Fatalf("Status().Owned: %d, want %d", n, len(want))
	}
	g.st.trustEnd = time.Now().Add(-time.Millisecond)
	if got, n := g.Owned(), g.Status().Owned; got != nil || n != 0 {
		t.Fatalf("after the trust window: Owned %v, Status().Owned %d; want none", got, n)
	}
}
