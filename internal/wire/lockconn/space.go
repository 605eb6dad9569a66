package lockconn

import (
	"fmt"
	"hash/fnv"
)

// pgleader's own lock space. Besides the elections' own keys, pgleader
// takes advisory locks for its bookkeeping, all of them pair keys
// (objsubid 2) whose first half is Space, "pgLH". Every lock of the space
// is built here, and only here:
//
//	lock                  second half                          held by                  mode
//	key roster            Roster(key) = fnv32a("c.o.s")        every quiet candidate    share
//	key heir slot i       Roster(key) + 1 + i  (i < Heirs)     an heir                  exclusive (try)
//	key gate              Roster(key) - 1                      a leader handing over    exclusive (try)
//	key name lock         fnv32a("c.o.s|identity")             a leader handing over    exclusive (try)
//	group roster          fnv32a("group|name")                 every group member       share
//	group member lock     fnv32a("member|group|identity")      a member's main session  exclusive (try)
//
// What a collision costs. The second halves are 32-bit hashes, so two of
// them can meet: a key's slot with another key's roster, a group roster
// with a name lock. No collision can make two sessions lead one key: an
// election's key is taken only in the key's own space (the application's
// key), never here, and every lock here only decides *who waits or who
// is asked*. A collision can only delay: a slot taken by a colliding
// roster's sharer is a slot no follower holds (followers poll instead;
// an election takes up to Poll), a colliding gate makes one named
// hand-over fall back to "any candidate", a colliding member lock makes a
// group member join unwatched (its death is seen at the next round). The
// same holds for an application, or another role, that takes pair keys
// with Space as first half: it may delay elections, never break their
// safety (docs/security.md).
const Space int32 = 0x70674C48

// spaceHash is the 32-bit FNV-1a hash the space's second halves use.
func spaceHash(format string, args ...any) int32 {
	h := fnv.New32a()
	fmt.Fprintf(h, format, args...)
	return int32(h.Sum32())
}

// Roster is the second half of t's roster lock, which every quiet
// candidate holds in share mode; slot i of t's heir slots is Roster()+1+i,
// and its gate Roster()-1.
func (t *Target) Roster() int32 { return spaceHash("%d.%d.%d", t.ClassID, t.ObjID, t.ObjSubID) }

// Slot is the second half of t's heir slot i.
func (t *Target) Slot(i int) int32 { return t.Roster() + 1 + int32(i) }

// Gate is the second half of t's gate lock (see Lease.Reserve).
func (t *Target) Gate() int32 { return t.Roster() - 1 }

// NameLock is the second half of the lock that reserves t for the
// candidate named identity.
func (t *Target) NameLock(identity string) int32 {
	return spaceHash("%d.%d.%d|%s", t.ClassID, t.ObjID, t.ObjSubID, identity)
}

// GroupRoster is the second half of a group's roster lock, which every
// member holds in share mode.
func GroupRoster(group string) int32 { return spaceHash("group|%s", group) }

// MemberLock is the second half of the member lock of identity in group,
// which the member's main session holds exclusively (the crash watch of
// the member before it in the ring waits on it).
func MemberLock(group, identity string) int32 { return spaceHash("member|%s|%s", group, identity) }
