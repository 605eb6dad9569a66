// Package inspect reads what pgleader leaves in pg_locks and
// pg_stat_activity, for status pages, dashboards and tools such as
// pgleader status: which advisory locks are pgleader's own bookkeeping,
// which group a session belongs to, which election a statement names.
//
// Everything here reads values any role can see, and none of it is proof
// of anything: a session of any role can take any advisory lock and set
// any statement text. Show it, never act on it (docs/security.md).
package inspect

import (
	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/leader"
)

// Space is the first half (pg_locks.classid, with objsubid 2) of every
// advisory lock pgleader takes for its own bookkeeping: a key's roster,
// heir slots, gate and name locks, a group's roster and member locks.
const Space = uint32(lockconn.Space)

// InSpace reports whether an advisory lock, as pg_locks shows it, is in
// pgleader's own space.
func InSpace(classid uint32, objsubid int16) bool { return classid == Space && objsubid == 2 }

// KeyRoster returns the lock every quiet candidate for key holds in share
// mode (classid, objid, objsubid 2): its holders are the standing
// candidates.
func KeyRoster(key leader.Key) (classid, objid uint32) {
	return Space, uint32(lockconn.NewTarget(key, "", "", "").Roster())
}

// GroupRoster returns the lock a group's members hold in share mode
// (classid, objid, objsubid 2): its holders are the group's members.
func GroupRoster(group string) (classid, objid uint32) {
	return Space, uint32(lockconn.GroupRoster(group))
}

// ParseGroupMarker reads a group member's pg_stat_activity.query (every
// batch a member sends ends with a marker): the group's name and the size
// of its key set, and whether query is a marker at all.
func ParseGroupMarker(query string) (group string, keys int, ok bool) {
	return lockconn.ParseGroupMarker(query)
}

// ParseNameMarker reads the election name an elector's statement carries
// (its pg_stat_activity.query). Check that the name hashes to the key the
// session holds or waits for (leader.KeyFromName) before showing it.
func ParseNameMarker(query string) (name string, ok bool) { return lockconn.ParseNameMarker(query) }
