package leader

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strconv"
	"unicode/utf8"
)

// Key names one PostgreSQL advisory lock. The zero Key is invalid; build one
// with [Int64Key], [PairKey] or [KeyFromName]. Keys are comparable values.
type Key struct {
	classid, objid uint32
	objsubid       int16 // 1: bigint key space, 2: (int4, int4) key space, 0: invalid
	name           string
}

// KeyFromNameSQL is the SQL expression that [KeyFromName] computes, with the
// name as $1. It needs PostgreSQL 11 or later (for sha256).
const KeyFromNameSQL = `('x' || left(encode(sha256(convert_to($1::text, 'UTF8')), 'hex'), 16))::bit(64)::bigint`

// Int64Key returns the key that pg_advisory_lock(k) locks.
func Int64Key(k int64) Key {
	u := uint64(k)
	return Key{classid: uint32(u >> 32), objid: uint32(u), objsubid: 1}
}

// PairKey returns the key that pg_advisory_lock(ns, id) locks: a namespaced
// key, so that PairKey(confirm, 7) and PairKey(refund, 7) are different
// locks. The pair key space never collides with the bigint key space.
func PairKey(ns, id int32) Key {
	return Key{classid: uint32(ns), objid: uint32(id), objsubid: 2}
}

// KeyFromName maps a name to a bigint key: the first eight bytes of the
// SHA-256 of the name, big-endian. It is stable across releases and equal to
// [KeyFromNameSQL] evaluated in PostgreSQL. An empty or invalid UTF-8 name
// gives an invalid key, which the elector's New rejects.
func KeyFromName(name string) Key {
	if name == "" || !utf8.ValidString(name) {
		return Key{name: name}
	}
	sum := sha256.Sum256([]byte(name))
	k := Int64Key(int64(binary.BigEndian.Uint64(sum[:8])))
	k.name = name
	return k
}

// Valid reports whether k names a lock.
func (k Key) Valid() bool { return k.objsubid == 1 || k.objsubid == 2 }

// IsPair reports whether k is in the (int4, int4) key space.
func (k Key) IsPair() bool { return k.objsubid == 2 }

// Int64 returns the bigint value of a key in the bigint key space, and false
// for a pair key.
func (k Key) Int64() (int64, bool) {
	if k.objsubid != 1 {
		return 0, false
	}
	return int64(uint64(k.classid)<<32 | uint64(k.objid)), true
}

// Pair returns the two int4 values of a pair key, and false for a bigint key.
func (k Key) Pair() (ns, id int32, ok bool) {
	if k.objsubid != 2 {
		return 0, 0, false
	}
	return int32(k.classid), int32(k.objid), true
}

// Name returns the name a key was made from with [KeyFromName], or "".
func (k Key) Name() string { return k.name }

// LockTag returns the values pg_locks shows for this key in its classid,
// objid and objsubid columns (with locktype = 'advisory').
func (k Key) LockTag() (classid, objid uint32, objsubid int16) {
	return k.classid, k.objid, k.objsubid
}

// KeyFromLockTag is the inverse of [Key.LockTag]: it decodes a pg_locks row
// of locktype 'advisory'. It returns an invalid key for an objsubid other
// than 1 or 2.
func KeyFromLockTag(classid, objid uint32, objsubid int16) Key {
	if objsubid != 1 && objsubid != 2 {
		return Key{}
	}
	return Key{classid: classid, objid: objid, objsubid: objsubid}
}

// String renders the key for logs: "42" for a bigint key, "7:42" for a pair
// key, and "name(42)" for a key made from a name.
func (k Key) String() string {
	switch k.objsubid {
	case 1:
		v, _ := k.Int64()
		if k.name != "" {
			return k.name + "(" + strconv.FormatInt(v, 10) + ")"
		}
		return strconv.FormatInt(v, 10)
	case 2:
		return fmt.Sprintf("%d:%d", int32(k.classid), int32(k.objid))
	default:
		return "invalid-key"
	}
}

// SQLArgs returns the argument list of an advisory-lock function call for
// this key, with placeholders numbered from first, and the values to bind.
// For example a bigint key gives ("$1::pg_catalog.int8", [k]) and a pair
// key gives ("$1::pg_catalog.int4, $2::pg_catalog.int4", [ns, id]). The
// types name their schema, so that no type another role creates earlier in
// a search_path can take their place; call the lock functions the same way
// (pg_catalog.pg_advisory_lock).
func (k Key) SQLArgs(first int) (string, []any) {
	if ns, id, ok := k.Pair(); ok {
		return fmt.Sprintf("$%d::pg_catalog.int4, $%d::pg_catalog.int4", first, first+1), []any{ns, id}
	}
	v, _ := k.Int64()
	return fmt.Sprintf("$%d::pg_catalog.int8", first), []any{v}
}

// SlotKey is slot i of a semaphore on key (lock.TryRunN,
// elector.NewSemaphore): key itself for slot 0, so a semaphore of one slot
// is the plain lock, and for i > 0 the key made from the name "NAME#i",
// where NAME is key's name, or its number ("42", "7:42") for a key not
// made from a name. pgleader status shows slot i of "backfill" as
// "backfill#i".
func SlotKey(key Key, i int) Key {
	if i == 0 {
		return key
	}
	base := key.Name()
	if base == "" {
		base = key.String()
	}
	return KeyFromName(base + "#" + strconv.Itoa(i))
}
