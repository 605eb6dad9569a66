// Package lock holds the one-shot advisory-lock tools, beside the
// long-running elector: run a job on one replica only (TryRun, and
// pgleader lock), serialise a workflow per entity inside a transaction
// (Tx, TryTx), make a handler idempotent (RunTx), and keep session locks
// from leaking through a connection pool (GuardPool).
//
// They share the elector's lock session (internal/wire/lockconn.Lease): the same
// guarded acquisition that never stacks, the same adoption of a grant that
// raced its lock_timeout, the same check in pg_locks of the session's own
// backend, and the same refusal of a standby. Keys, holders and errors
// about the environment are the leader package's.
package lock
