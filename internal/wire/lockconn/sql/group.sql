-- A group member's main session (see group.go): join, one round's scan,
-- the exchange of locks, the fencing terms, leaving. Every key is passed
-- as pg_locks shows it; $1 and $2 of the exchange's statements are the
-- session's backend pid and token (exchange_guard).

-- name: member_lock
-- The member lock (Space, $2): one session per identity in a group. NULL,
-- with nothing taken, on a backend other than the session's own ($3, with
-- its token $4) or on a standby (the second column), as every statement
-- here that takes a lock; leave, which frees them, frees nothing on a
-- backend other than the session's own either.
SELECT CASE WHEN coalesce(pg_backend_pid() = $3 AND current_setting('pgleader.owner', true) = $4 AND NOT pg_is_in_recovery(), false)
  THEN pg_try_advisory_lock($1, $2) END, pg_is_in_recovery()

-- name: join
-- Take the roster lock ($1, $2) in share mode and, only when it was
-- taken, tell the group on $3 (payload $4): the NOTIFY is an InitPlan in
-- the CASE's THEN branch, which PostgreSQL runs only when that branch is.
-- A NOTIFY's commit waits for the server-wide notify queue lock, under
-- lock_timeout, and a timeout there is an ERROR the server logs with no
-- statement: every statement that notifies turns lock_timeout off for its
-- own transaction (the caller's deadline bounds the wait). NULL, with
-- nothing taken, on a backend other than the session's own ($5, with its
-- token $6) or on a standby (the second column): a round that has not
-- joined yet joins before its check.
SELECT CASE WHEN NOT coalesce(pg_backend_pid() = $5 AND current_setting('pgleader.owner', true) = $6 AND NOT pg_is_in_recovery(), false) THEN NULL
  WHEN pg_try_advisory_lock_shared($1, $2) THEN (SELECT true FROM pg_notify($3, $4)) ELSE false END, pg_is_in_recovery()
FROM (SELECT set_config('lock_timeout', '0', true)) s

-- name: exclusive_holder
-- Who holds the lock ($1, $2, 2) of pgleader's space exclusively: one
-- read of pg_locks, made only after a try failed.
SELECT l.pid, coalesce(pg_get_userbyid(a.usesysid)::text, ''), coalesce(a.application_name, ''),
  coalesce(a.usesysid = (SELECT usesysid FROM pg_stat_get_activity(pg_backend_pid())), false)
FROM pg_locks l LEFT JOIN pg_stat_get_activity(NULL) a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.classid = $1::oid AND l.objid = $2::oid AND l.objsubid = 2 AND l.granted
  AND l.mode = 'ExclusiveLock' AND l.pid <> pg_backend_pid() LIMIT 1

-- name: capacity
-- The settings that size the server's shared lock table.
SELECT current_setting('max_locks_per_transaction')::int, current_setting('max_connections')::int,
  current_setting('max_prepared_transactions')::int

-- name: check
-- The session's own backend, with its token, on a primary.
SELECT pg_backend_pid(), current_setting('pgleader.owner', true), pg_is_in_recovery()

-- name: scan
-- One scan of pg_locks proves this session's locks and reads the members:
-- a row per advisory lock this backend holds exclusively (outside
-- pgleader's space $1), then a row per member with its backend pid. A
-- member is a session of this session's own login role that holds the
-- roster lock ($1, $2): any role can take that lock, and a session of
-- another role that does is no member (keys assigned to it would go
-- unled). It reads no shared catalog: a round must renew the keys while
-- another role fills the lock table (see the package doc).
WITH l AS MATERIALIZED (SELECT classid, objid, objsubid, pid, granted, mode FROM pg_locks
  WHERE locktype = 'advisory' AND database = (SELECT datid FROM pg_stat_get_activity(pg_backend_pid())))
SELECT true, classid, objid, objsubid, '', 0 FROM l WHERE pid = pg_backend_pid() AND granted AND mode = 'ExclusiveLock' AND classid <> $1::oid
UNION ALL
SELECT false, 0, 0, 0, coalesce(a.application_name, ''), l.pid FROM l JOIN pg_stat_get_activity(NULL) a ON a.pid = l.pid
  WHERE l.classid = $1::oid AND l.objid = $2::oid AND l.objsubid = 2 AND l.granted
    AND a.usesysid = (SELECT usesysid FROM pg_stat_get_activity(pg_backend_pid()))

-- name: sync_off
-- An exchange's batch is one implicit transaction, and its NOTIFY makes it
-- commit a record, which need not wait for a WAL flush: nothing in it is
-- durable state (the fencing terms are written apart, durably). Nor for
-- lock_timeout at the notify queue's lock (see join).
SELECT set_config('synchronous_commit', 'off', true), set_config('lock_timeout', '0', true)

-- name: unlock_int8
-- Release the bigint keys $3; each call is a no-op on any backend but the
-- session's own, with its token, on a primary: a light round sends its
-- check in the same round trip, so nothing may be locked or unlocked
-- before the check is read.
SELECT count(*) FILTER (WHERE CASE WHEN pg_backend_pid() = $1 AND current_setting('pgleader.owner', true) = $2 AND NOT pg_is_in_recovery()
  THEN pg_advisory_unlock(k) ELSE false END) FROM unnest($3::int8[]) k

-- name: unlock_pair
-- Release the pair keys ($3[i], $4[i]), guarded as unlock_int8.
SELECT count(*) FILTER (WHERE CASE WHEN pg_backend_pid() = $1 AND current_setting('pgleader.owner', true) = $2 AND NOT pg_is_in_recovery()
  THEN pg_advisory_unlock(a, b) ELSE false END) FROM unnest($3::int4[], $4::int4[]) AS u(a, b)

-- name: notify
-- (see join: no lock_timeout at the commit's notify queue lock)
SELECT pg_notify($1, $2), set_config('lock_timeout', '0', true)

-- name: try_lock
-- Try the bigint keys $3 and the pair keys ($4[i], $5[i]), guarded as
-- unlock_int8; never a wait. Returns the keys won, as pg_locks shows them.
SELECT ((k >> 32) & 4294967295)::oid, (k & 4294967295)::oid, 1::int2 FROM unnest($3::int8[]) k
  WHERE CASE WHEN pg_backend_pid() = $1 AND current_setting('pgleader.owner', true) = $2 AND NOT pg_is_in_recovery()
    THEN pg_try_advisory_lock(k) ELSE false END
UNION ALL SELECT (a::int8 & 4294967295)::oid, (b::int8 & 4294967295)::oid, 2::int2 FROM unnest($4::int4[], $5::int4[]) AS u(a, b)
  WHERE CASE WHEN pg_backend_pid() = $1 AND current_setting('pgleader.owner', true) = $2 AND NOT pg_is_in_recovery()
    THEN pg_try_advisory_lock(a, b) ELSE false END

-- name: bump
-- Install the next term of several keys at once in the terms table
-- TERMS (replaced by its quoted name): keys ($1[i], $2[i], $3[i]) named
-- $4[i], for the member $5.
INSERT INTO TERMS AS t (classid, objid, objsubid, key_name, term, holder, elected_at)
SELECT c, o, s, n, 1, $5::text, now() FROM unnest($1::oid[], $2::oid[], $3::int2[], $4::text[]) AS u(c, o, s, n)
ON CONFLICT (classid, objid, objsubid) DO UPDATE SET term = t.term + 1, holder = EXCLUDED.holder, elected_at = EXCLUDED.elected_at
RETURNING classid, objid, objsubid, term

-- name: leave
-- Free every lock of the session (keys, member and roster locks), then
-- tell the group on $1 (payload $2): the NOTIFY goes out at commit,
-- after the unlocks. NULL, with nothing freed or told, on a backend other
-- than the session's own ($3, with its token $4), whose locks are another
-- client's.
SELECT CASE WHEN coalesce(pg_backend_pid() = $3 AND current_setting('pgleader.owner', true) = $4, false)
  THEN (SELECT true FROM (SELECT pg_advisory_unlock_all()) u, pg_notify($1, $2) n) END, set_config('lock_timeout', '0', true)
