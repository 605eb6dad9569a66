package group

import (
	"slices"
	"sort"

	"github.com/pgleader/pgleader/leader"
)

// The assignment: every member computes the same assignment of keys to
// members from the same list of members, so no coordination is needed
// beyond reading pg_locks. Its hash is pinned across versions by golden
// vectors (assign_test.go): members of two versions must agree.

// keyOrder returns the keys in the order assign takes them: by their own
// hash, then by lock tag.
func keyOrder(keys map[tag]leader.Key) []tag {
	type hashed struct {
		k tag
		h uint64
	}
	hs := make([]hashed, 0, len(keys))
	for k := range keys {
		hs = append(hs, hashed{k, keyHash(k)})
	}
	sort.Slice(hs, func(i, j int) bool {
		if hs[i].h != hs[j].h {
			return hs[i].h < hs[j].h
		}
		a, b := hs[i].k, hs[j].k
		return a.C < b.C || a.C == b.C && (a.O < b.O || a.O == b.O && a.S < b.S)
	})
	order := make([]tag, len(hs))
	for i, h := range hs {
		order[i] = h.k
	}
	return order
}

// assign gives each key in order (see keyOrder) to one of members, and
// returns, per key, the index of its member (-1 with no members):
// rendezvous hashing with bounded loads. Every key, in that order, goes to
// the member that ranks it highest among those with room left; each member
// has room for ⌊K/M⌋ keys, the first K mod M members (in name order) for
// one more. A held key (resigned by a member) goes, in its turn, to the
// member that ranks it highest but the one that resigned it, past the
// bound when needed, and counts against the one that resigned it: every
// other key then sees the same room as without the hold, so a resign moves
// that key only.
func assign(order []tag, members []string, holds map[tag]resignHold) []int {
	owner := make([]int, len(order))
	m := len(members)
	if m == 0 {
		for i := range owner {
			owner[i] = -1
		}
		return owner
	}
	room := make([]int, m)
	for i := range room {
		room[i] = len(order) / m
		if i < len(order)%m {
			room[i]++
		}
	}
	pick := func(k tag, avoid int, bounded bool) int {
		best, bestScore := -1, uint64(0)
		for i, name := range members {
			if i == avoid || bounded && room[i] <= 0 {
				continue
			}
			if s := score(k, name); best < 0 || s > bestScore {
				best, bestScore = i, s
			}
		}
		if best >= 0 {
			if avoid >= 0 {
				room[avoid]--
			} else {
				room[best]--
			}
		}
		return best
	}
	// A held key is given in its own turn, so that every other key sees
	// the same room as without the hold and goes to the same member.
	for i, k := range order {
		if h, ok := holds[k]; ok && m > 1 {
			if a := slices.Index(members, h.member); a >= 0 {
				owner[i] = pick(k, a, false)
				continue
			}
		}
		owner[i] = pick(k, -1, true)
	}
	return owner
}

// FNV-1a, 64 bits, over a key's lock tag and a member's name: the same in
// every process and every version of this package (the assignment depends
// on it, so members must agree).
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

func fnvTag(h uint64, k tag) uint64 {
	for _, v := range [...]uint32{k.C, k.O, uint32(uint16(k.S))} {
		for i := 0; i < 32; i += 8 {
			h = (h ^ uint64(byte(v>>i))) * fnvPrime
		}
	}
	return h
}

func keyHash(k tag) uint64 { return mix(fnvTag(fnvOffset, k)) }

func score(k tag, member string) uint64 {
	h := fnvTag(fnvOffset, k)
	h = (h ^ '|') * fnvPrime
	for i := 0; i < len(member); i++ {
		h = (h ^ uint64(member[i])) * fnvPrime
	}
	return mix(h)
}

// mix finishes a hash with a multiply-xorshift: fnv's low bits mix poorly
// for similar inputs.
func mix(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	return x
}

// successorOf is the member that gets a key member me resigned: the one that
// ranks it highest but me, as assign gives a held key.
func successorOf(k tag, members []string, me string) string {
	best, bestScore := "", uint64(0)
	for _, name := range members {
		if name == me {
			continue
		}
		if s := score(k, name); best == "" || s > bestScore {
			best, bestScore = name, s
		}
	}
	return best
}

// ringNext returns the member after me in name order ("" when alone or
// not listed).
func ringNext(members []string, me string) string {
	i := slices.Index(members, me)
	if i < 0 || len(members) < 2 {
		return ""
	}
	return members[(i+1)%len(members)]
}
