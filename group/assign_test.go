package group

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/pgleader/pgleader/leader"
)

// Members of two versions must compute the same assignment, or a rolling
// upgrade would have them take each other's keys. These vectors were
// computed with the release before the group moved to its own package,
// and pin the hash and the assignment for good: a change here is a
// breaking change of the protocol.
func TestAssignmentVectors(t *testing.T) {
	for _, v := range []struct {
		name      string
		key, a, b uint64
	}{
		{"tenant/acme", 0xdb18c0b338b2f3f6, 0xf17628d38d72bfa0, 0x327b79d9a56e569c},
		{"tenant/globex", 0xb4b21d368e3a2f2c, 0x5b5ad44242736259, 0xeee3da5c0bbfc3af},
		{"shard-0", 0x54b763e3b1804d23, 0xeb7f9178f0336d26, 0x726064eeb0831e4},
		{"shard-1", 0x7adaabe24f6e831a, 0x4280ca5f1342341d, 0x1767df80356e459b},
	} {
		k := tagOf(leader.KeyFromName(v.name))
		if got := keyHash(k); got != v.key {
			t.Errorf("keyHash(%s) = %#x, want %#x", v.name, got, v.key)
		}
		if got := score(k, "replica-a"); got != v.a {
			t.Errorf("score(%s, replica-a) = %#x, want %#x", v.name, got, v.a)
		}
		if got := score(k, "replica-b"); got != v.b {
			t.Errorf("score(%s, replica-b) = %#x, want %#x", v.name, got, v.b)
		}
	}
	for _, v := range []struct {
		keys, members int
		digest        uint64
	}{
		{1, 1, 0xaf63bc4c8601b62c}, {1, 2, 0xaf63bc4c8601b62c}, {1, 3, 0xaf63bc4c8601b62c}, {1, 5, 0xaf63bc4c8601b62c},
		{7, 1, 0x1974b59b26a692fe}, {7, 2, 0xe95206a3974048bf}, {7, 3, 0xb60b8fbd6824369a}, {7, 5, 0xe83609bc4954458f},
		{100, 1, 0x55d53d2a6c2c3e79}, {100, 2, 0x9637a25d0d6e5fff}, {100, 3, 0x96289ab0c8823e22}, {100, 5, 0x4458639eafc0426f},
	} {
		order, members := vectorInput(v.keys, v.members)
		if got := digest(assign(order, members, nil)); got != v.digest {
			t.Errorf("assign(%d keys, %d members) digest %#x, want %#x", v.keys, v.members, got, v.digest)
		}
	}
}

func vectorInput(n, m int) ([]tag, []string) {
	set := map[tag]leader.Key{}
	for i := range n {
		k := leader.KeyFromName(fmt.Sprintf("vec/%d", i))
		set[tagOf(k)] = k
	}
	var members []string
	for j := range m {
		members = append(members, fmt.Sprintf("m%d", j))
	}
	return keyOrder(set), members
}

// digest is FNV-1a over the owner indexes.
func digest(owner []int) uint64 {
	h := uint64(14695981039346656037)
	for _, o := range owner {
		h = (h ^ uint64(o+1)) * 1099511628211
	}
	return h
}

// The bounds, over a grid of sizes: every key has one owner, and each
// member leads ⌊K/M⌋ or ⌈K/M⌉ keys (the first K mod M members in name
// order one more); no members, no owners.
func TestAssignBounds(t *testing.T) {
	for _, n := range []int{0, 1, 2, 3, 10, 99, 1000} {
		for _, m := range []int{0, 1, 2, 3, 4, 7, 16} {
			order, members := vectorInput(n, m)
			owner := assign(order, members, nil)
			if len(owner) != n {
				t.Fatalf("%d keys, %d owners", n, len(owner))
			}
			count := make([]int, m)
			for _, o := range owner {
				if m == 0 {
					if o != -1 {
						t.Fatalf("no members, owner %d", o)
					}
					continue
				}
				if o < 0 || o >= m {
					t.Fatalf("%d keys on %d members: owner %d", n, m, o)
				}
				count[o]++
			}
			for i, c := range count {
				want := n / m
				if i < n%m {
					want++
				}
				if c != want {
					t.Fatalf("%d keys on %d members: member %d leads %d, want %d", n, m, i, c, want)
				}
			}
		}
	}
}

// A hold (a member resigned a key) moves that key only: every other key
// keeps its owner, whatever the sizes and whichever key is held; the held
// key goes to the member that ranks it highest but the one that resigned
// it (successorOf), past the bound if it must.
func TestAssignHoldMovesOnlyTheHeldKey(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 300 {
		n, m := 1+rng.IntN(60), 2+rng.IntN(6)
		order, members := vectorInput(n, m)
		base := assign(order, members, nil)
		i := rng.IntN(n)
		k := order[i]
		from := members[base[i]]
		held := assign(order, members, map[tag]resignHold{k: {member: from, until: time.Now()}})
		for j := range order {
			if j == i {
				if members[held[j]] == from || members[held[j]] != successorOf(k, members, from) {
					t.Fatalf("held key went to %s, want successorOf = %s (resigned by %s)", members[held[j]], successorOf(k, members, from), from)
				}
				continue
			}
			if held[j] != base[j] {
				t.Fatalf("%d keys, %d members: a hold of key %d moved key %d too", n, m, i, j)
			}
		}
	}
}

// ringNext: the member after me in name order, wrapping; none when alone
// or not listed.
func TestRingNext(t *testing.T) {
	for _, c := range []struct {
		members []string
		me      string
		want    string
	}{
		{[]string{"a", "b", "c"}, "a", "b"},
		{[]string{"a", "b", "c"}, "c", "a"},
		{[]string{"a"}, "a", ""},
		{[]string{"a", "b"}, "x", ""},
		{nil, "a", ""},
	} {
		if got := ringNext(c.members, c.me); got != c.want {
			t.Errorf("ringNext(%v, %s) = %q, want %q", c.members, c.me, got, c.want)
		}
	}
}
