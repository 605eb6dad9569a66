-- Handover on demand (see handover.go): a leader asked to step down, by
-- whom, and the reservation of the key for a named candidate. The gate and
-- name locks are pairs in pgleader's space (space.go).

-- name: requester
-- The asker's role, and whether it may ask: a superuser, a member of this
-- session's role, or a member of a role in $2. The server stamped $1 on
-- the request, and no client can forge it.
SELECT r.rolname::text, r.rolsuper OR pg_has_role(r.oid, session_user, 'MEMBER')
    OR EXISTS (SELECT FROM pg_roles g WHERE g.rolname = ANY($2::text[]) AND pg_has_role(r.oid, g.oid, 'MEMBER'))
  FROM pg_stat_activity a JOIN pg_roles r ON r.oid = a.usesysid WHERE a.pid = $1

-- name: reply
-- (no lock_timeout at the commit's notify queue lock: see group.sql's join)
SELECT pg_notify($1, $2), set_config('lock_timeout', '0', true)

-- A session named N: its application_name is N, or N and a ranked
-- candidate's rank ("N [N0 1.8.0]", see leader.Rank), as the standing,
-- reserve and queued statements match it.

-- name: standing
-- A session named $1 stands for the key: it holds the key's roster lock
-- ($2, $3, 2) in share mode (a quiet candidate) or waits for the key
-- ($4, $5, $6).
SELECT EXISTS (SELECT FROM pg_locks l JOIN pg_stat_get_activity(NULL) a ON a.pid = l.pid
  WHERE l.locktype = 'advisory' AND (a.application_name = $1 OR (starts_with(a.application_name, $1 || ' [') AND substr(a.application_name, length($1) + 1) ~ '^ \[[PNO]-?[0-9]+( v?[0-9][0-9A-Za-z.+-]*)?\]$')) AND l.pid <> pg_backend_pid()
    AND ((l.classid = $2::oid AND l.objid = $3::oid AND l.objsubid = 2 AND l.granted)
      OR (l.classid = $4::oid AND l.objid = $5::oid AND l.objsubid = $6::int2 AND NOT l.granted)))

-- name: reserve
-- Take the gate ($1, $2) and the name lock ($1, $3), and announce the
-- reservation on $4 (payload $5) only when both were taken: the NOTIFY is
-- an InitPlan in the CASE's THEN branch, run only when that branch is.
-- The last column says whether a session named $5 already waits for the
-- key ($6, $7, $8), as the queued statement does: an heir usually does,
-- and the reservation then needs no second round trip.
SELECT g, n, CASE WHEN g AND n THEN (SELECT true FROM pg_notify($4, $5)) ELSE false END AS announced,
  g AND n AND EXISTS (SELECT FROM pg_locks l JOIN pg_stat_get_activity(NULL) a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.classid = $6::oid AND l.objid = $7::oid AND l.objsubid = $8::int2 AND NOT l.granted
      AND (a.application_name = $5 OR (starts_with(a.application_name, $5 || ' [') AND substr(a.application_name, length($5) + 1) ~ '^ \[[PNO]-?[0-9]+( v?[0-9][0-9A-Za-z.+-]*)?\]$'))) AS queued
FROM (SELECT pg_try_advisory_lock($1, $2) g, pg_try_advisory_lock($1, $3) n, set_config('lock_timeout', '0', true) x) s

-- name: queued
-- A session named $1 waits for the key ($2, $3, $4).
SELECT EXISTS (SELECT FROM pg_locks l JOIN pg_stat_get_activity(NULL) a ON a.pid = l.pid
  WHERE l.locktype = 'advisory' AND l.classid = $2::oid AND l.objid = $3::oid AND l.objsubid = $4::int2 AND NOT l.granted
    AND (a.application_name = $1 OR (starts_with(a.application_name, $1 || ' [') AND substr(a.application_name, length($1) + 1) ~ '^ \[[PNO]-?[0-9]+( v?[0-9][0-9A-Za-z.+-]*)?\]$')))

-- name: release
-- Release the gate ($1, $2) when $4, the name lock ($1, $3) when $5.
SELECT CASE WHEN $4 THEN pg_advisory_unlock($1, $2) END, CASE WHEN $5 THEN pg_advisory_unlock($1, $3) END

-- name: functions
-- The followers' side of a reservation, created with the quiet functions
-- (sql/quiet.sql), which call it at the moment they win the key.
CREATE OR REPLACE FUNCTION pg_temp.pgleader_reserved(gate int4, me int4) RETURNS bool
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $f$
-- A handover reserves the key for another candidate: true when the gate
-- (Space, gate) is held exclusively by a session of this session's own
-- login role and this session's name lock (Space, me) is free (it is not
-- the candidate named). Any role can take any advisory lock, so the gate
-- binds only as far as pg_locks proves it, read only when the gate is
-- held. gate NULL: this session no longer heeds gates (see quiet.go).
BEGIN
  IF gate IS NULL OR pg_temp.pgleader_lock(1885817928, gate::oid, 2::int2, 'probe') THEN
    RETURN false;
  END IF;
  IF NOT pg_temp.pgleader_lock(1885817928, me::oid, 2::int2, 'probe') THEN
    RETURN false;
  END IF;
  RETURN pg_temp.pgleader_gate_ours(gate);
END $f$;

CREATE OR REPLACE FUNCTION pg_temp.pgleader_gate_ours(gate int4) RETURNS bool
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $f$
-- The gate (Space, gate) is held exclusively by a session of this
-- session's own login role. NULL matches nothing (pgleader_warm's
-- call, which reads pg_locks all the same).
BEGIN
  RETURN EXISTS (SELECT FROM pg_locks l JOIN pg_stat_get_activity(NULL) a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.classid = 1885817928 AND l.objid = (gate::int8 & 4294967295)::oid AND l.objsubid = 2
      AND l.granted AND l.mode = 'ExclusiveLock'
      AND a.usesysid = (SELECT usesysid FROM pg_stat_get_activity(pg_backend_pid())));
END $f$;

CREATE OR REPLACE FUNCTION pg_temp.pgleader_warm(gate int4, me int4) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $f$
-- Once per session, when it first takes an heir slot. An heir is the
-- session most likely to win the key in a reserved handover: it gives the
-- lock back (pgleader_reserved), or it is the one named and keeps it. In
-- a session that never ran them, those few statements are planned on the
-- handover's path, and the first pg_locks lookup loads the catalog
-- caches: about 3 ms of the server's time on a small VM, against 0.5 ms
-- after. The same holds for pgleader_wait's own statements after a grant
-- (the wait's measure, the reservation's check, the slot's release):
-- PL/pgSQL plans a statement when it first runs, and an heir's rounds
-- that time out never reach them, so they would be planned at the
-- session's first win (about 0.3 ms more on a preference handover or a
-- crash failover, on a small VM).
-- This runs each of them once now, on a lock that only this session uses,
-- its own name lock (Space, me): first an heir's round on it, as its own
-- heir slot (it takes the free lock at once and releases it as the slot),
-- then the lock taken and released again by a try. When a reservation for
-- this session holds it, the round's 1 ms wait ends caught, without a log
-- line, and the try fails: nothing is taken or released. Last, a lookup
-- that matches nothing.
DECLARE
  code int;
  plan text;
BEGIN
  IF current_setting('pgleader.warm', true) IS DISTINCT FROM 'on' THEN
    PERFORM pg_temp.pgleader_reserved(gate, me);
    IF me IS NOT NULL THEN
      CALL pg_temp.pgleader_wait(1885817928, me::oid, 2::int2, pg_backend_pid(),
        current_setting('pgleader.owner', true), 1, me, gate, me, code, plan);
    END IF;
    IF pg_temp.pgleader_lock(1885817928, me::oid, 2::int2, 'try') THEN
      PERFORM pg_temp.pgleader_lock(1885817928, me::oid, 2::int2, 'unlock');
    END IF;
    PERFORM pg_temp.pgleader_gate_ours(NULL);
    PERFORM set_config('pgleader.warm', 'on', false);
  END IF;
END $f$;

-- name: rank
-- A candidate tells the leader its rank (see RankPayload) on the key's
-- resign channel $1 (no lock_timeout at the commit's notify queue lock,
-- and no WAL flush: nothing durable is in it).
SELECT pg_notify($1, $2), set_config('lock_timeout', '0', true), set_config('synchronous_commit', 'off', true)

-- name: candidate
-- The name of backend $1 when it is a candidate for the key: a session of
-- this session's own login role (other than this one) that holds the
-- key's roster lock ($2, $3, 2) in share mode (a quiet candidate) or waits
-- for the key ($4, $5, $6). No row otherwise. A rank message is believed
-- only for such a sender: the server stamps the sender's pid on a
-- notification, and no client can forge it.
SELECT coalesce(a.application_name, '') FROM pg_stat_get_activity($1::int4) a
WHERE a.pid <> pg_backend_pid()
  AND a.usesysid = (SELECT usesysid FROM pg_stat_get_activity(pg_backend_pid()))
  AND EXISTS (SELECT FROM pg_locks l WHERE l.pid = $1::int4 AND l.locktype = 'advisory'
    AND ((l.classid = $2::oid AND l.objid = $3::oid AND l.objsubid = 2 AND l.granted)
      OR (l.classid = $4::oid AND l.objid = $5::oid AND l.objsubid = $6::int2 AND NOT l.granted)))
