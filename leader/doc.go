// Package leader holds the vocabulary of pgleader: advisory-lock keys, the
// Leadership handed to an elected process, its fencing term, who holds a
// lock (Holder, Backend), how to connect (Connector, DSN), the Observer for
// metrics, and every error value (errors.go) shared by the elector and the
// one-shot locks of package lock.
//
// # Keys
//
// PostgreSQL has two advisory-lock key spaces, and a [Key] names a lock in
// either of them:
//
//   - a single bigint, [Int64Key] (what pg_advisory_lock(bigint) takes);
//   - a pair of int4 values, [PairKey] (what pg_advisory_lock(int4, int4)
//     takes), handy for a namespace and an entity id.
//
// [KeyFromName] maps a name onto a bigint key. The mapping is stable across
// releases and is plain SQL, so psql or a service in another language can
// compute the same key:
//
//	SELECT ('x' || left(encode(sha256(convert_to('billing-consumer', 'UTF8')), 'hex'), 16))::bit(64)::bigint;
//
// That is, the first eight bytes of the SHA-256 of the name's UTF-8 bytes,
// read as a big-endian two's-complement int64. [KeyFromNameSQL] holds the
// expression with a $1 placeholder.
//
// In pg_locks an advisory lock shows up with locktype = 'advisory' and the key
// spread over three columns. [Key.LockTag] returns them:
//
//	key space        classid              objid                objsubid
//	bigint k         k >> 32 (as uint32)  k & 0xffffffff       1
//	(int4 a, int4 b) a (as uint32)        b (as uint32)        2
package leader
