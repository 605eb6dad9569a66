-- The quiet follower's session functions (see quiet.go), created in the
-- session's own pg_temp, each written once for both key forms: a key is
-- passed as pg_locks shows it, (c, o, 1) for the bigint key c << 32 | o and
-- (c, o, 2) for the pair key (c, o). Result codes are quiet.go's roundCode.

-- name: functions
CREATE OR REPLACE FUNCTION pg_temp.pgleader_lock(c oid, o oid, s int2, how text) RETURNS bool
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $f$
-- One advisory-lock call on the key (c, o, s): 'try', 'try_shared' and
-- 'try_xact' (a transaction-level lock; see pgleader_held) never wait,
-- 'wait' waits (up to lock_timeout), 'unlock' and 'unlock_shared'
-- release, and 'probe' is true when the key is free or
-- this backend's: a shared lock taken and released at once, which never
-- outlives the call (followers that kept one into their exclusive wait
-- would deadlock each other; see pgleader_unshare for a cancel that lands
-- in between).
DECLARE
  k int8 := (c::int8 << 32) | o::int8;
  a int4 := (c::int8 - (c::int8 >> 31) * 4294967296)::int4;
  b int4 := (o::int8 - (o::int8 >> 31) * 4294967296)::int4;
BEGIN
  IF how = 'probe' THEN
    IF pg_temp.pgleader_lock(c, o, s, 'try_shared') THEN
      IF s = 1 THEN
        PERFORM pg_advisory_unlock_shared(k);
      ELSE
        PERFORM pg_advisory_unlock_shared(a, b);
      END IF;
      RETURN true;
    END IF;
    RETURN false;
  END IF;
  IF s = 1 THEN
    CASE how
      WHEN 'try' THEN RETURN pg_try_advisory_lock(k);
      WHEN 'try_shared' THEN RETURN pg_try_advisory_lock_shared(k);
      WHEN 'try_xact' THEN RETURN pg_try_advisory_xact_lock(k);
      WHEN 'wait' THEN PERFORM pg_advisory_lock(k); RETURN true;
      WHEN 'unlock' THEN RETURN pg_advisory_unlock(k);
      WHEN 'unlock_shared' THEN RETURN pg_advisory_unlock_shared(k);
    END CASE;
  END IF;
  CASE how
    WHEN 'try' THEN RETURN pg_try_advisory_lock(a, b);
    WHEN 'try_shared' THEN RETURN pg_try_advisory_lock_shared(a, b);
    WHEN 'try_xact' THEN RETURN pg_try_advisory_xact_lock(a, b);
    WHEN 'wait' THEN PERFORM pg_advisory_lock(a, b); RETURN true;
    WHEN 'unlock' THEN RETURN pg_advisory_unlock(a, b);
    WHEN 'unlock_shared' THEN RETURN pg_advisory_unlock_shared(a, b);
  END CASE;
END $f$;

CREATE OR REPLACE FUNCTION pg_temp.pgleader_unshare(c oid, o oid, s int2, gate int4, me int4) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $f$
-- After a cancel caught in a round: release every shared lock this backend
-- holds on the key (c, o, s), its gate and its name lock (Space, gate) and
-- (Space, me). A probe holds one only between its two calls, and a cancel
-- (a new leader's wake reaches an heir wherever its round is by then)
-- that lands there leaves it held: the catch rolls the subtransaction
-- back, and session locks outlive that. No session of pgleader holds one
-- of these in share mode otherwise, and a shared lock left on the key
-- would block every candidate's exclusive wait, and through the waiters
-- every other probe, so that nobody led until this session ended. pg_locks
-- shows a lock once however many times it is held: release until it is
-- gone. Only this rare path reads pg_locks.
DECLARE
  keys int8[] := ARRAY[(1885817928::int8 << 32) | (gate::int8 & 4294967295), (1885817928::int8 << 32) | (me::int8 & 4294967295)];
  r record;
BEGIN
  FOR r IN SELECT l.classid, l.objid, l.objsubid FROM pg_locks l
      WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid() AND l.mode = 'ShareLock' AND l.granted
        AND ((l.classid = c AND l.objid = o AND l.objsubid = s)
          OR (l.objsubid = 2 AND ((l.classid::int8 << 32) | l.objid::int8) = ANY (keys)))
  LOOP
    FOR i IN 1 .. 100 LOOP
      PERFORM pg_temp.pgleader_lock(r.classid, r.objid, r.objsubid, 'unlock_shared');
      EXIT WHEN NOT EXISTS (SELECT FROM pg_locks l WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid()
        AND l.mode = 'ShareLock' AND l.classid = r.classid AND l.objid = r.objid AND l.objsubid = r.objsubid);
    END LOOP;
  END LOOP;
END $f$;

CREATE OR REPLACE FUNCTION pg_temp.pgleader_held(c oid, o oid, s int2) RETURNS bool
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $f$
-- Whether this backend's own lock table has the key (c, o, s) in
-- exclusive mode, touching no shared memory when it has: the same lock
-- taken again at transaction level is granted from that table, whoever
-- waits. When it has not, the call is an ordinary try, true only when the
-- key is free with nobody queued: the subtransaction's rollback releases
-- that lock at once. So true means held here, or free an instant ago.
DECLARE
  got bool := false;
BEGIN
  BEGIN
    got := pg_temp.pgleader_lock(c, o, s, 'try_xact');
    RAISE EXCEPTION USING ERRCODE = 'P0001';
  EXCEPTION WHEN raise_exception THEN
    NULL;
  END;
  RETURN got;
END $f$;

CREATE OR REPLACE FUNCTION pg_temp.pgleader_mine(c oid, o oid, s int2) RETURNS bool
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $f$
-- This backend holds the key exclusively. pg_locks (a copy of the whole
-- lock table) is read only when the probe says the key is free or ours,
-- or, when the probe is refused, this backend's own lock table has the
-- key: a probe is refused also on a key this backend holds while another
-- session waits for it (the waiter's request conflicts with the shared
-- lock), and a round that took it for busy would wait for it, be granted
-- at once, and stack it. Never while another session leads.
BEGIN
  IF NOT pg_temp.pgleader_lock(c, o, s, 'probe') AND NOT pg_temp.pgleader_held(c, o, s) THEN
    RETURN false;
  END IF;
  RETURN EXISTS (SELECT FROM pg_locks l WHERE l.locktype = 'advisory' AND l.classid = c AND l.objid = o AND l.objsubid = s
    AND l.granted AND l.mode = 'ExclusiveLock' AND l.pid = pg_backend_pid());
END $f$;

CREATE OR REPLACE FUNCTION pg_temp.pgleader_guard(pid int4, tok text) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $f$
-- Before anything is locked: a standby gets 4 (ErrStandby), and a backend
-- other than the session's own, or without its token, 5
-- (ErrTransactionPooling); 0 goes on.
BEGIN
  IF pg_is_in_recovery() THEN
    RETURN 4;
  END IF;
  IF pg_backend_pid() <> pid OR current_setting('pgleader.owner', true) IS DISTINCT FROM tok THEN
    RETURN 5;
  END IF;
  RETURN 0;
END $f$;

CREATE OR REPLACE PROCEDURE pg_temp.pgleader_wait(c oid, o oid, s int2, pid int4, tok text, wait_ms int, heir int4, gate int4, me int4, OUT code int, OUT plan text)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $f$
-- An heir's round: wait for the key up to wait_ms, catching the wait's end
-- (no line in the server's log): lock_not_available (the wait's end),
-- query_canceled (the client stopping, or the key's new leader ending the
-- wait so that the heir reads its announcement: see pgleader_wake), and
-- deadlock_detected (a cycle another session made). Past deadlock_timeout
-- the server runs the deadlock detector once per wait; while log_lock_waits
-- is on it would also log the wait, so the wait then stays under
-- deadlock_timeout (four fifths of it). code 1: won (in this round's wait,
-- whose length the server measured is then in plan, see below); 3: held before
-- the round (a grant that raced the last round's timeout); 0: busy; 7:
-- busy, the wait cancelled (a new leader's wake, sent in its
-- announcement's transaction, so before that commits: the caller looks
-- the holder up in pg_locks rather than wait for the notification; or the
-- client stopping); 6: won and given back to a reservation; 4 and 5 from
-- the guard. A win releases the heir slot.
--
-- A cancel lands wherever the round is when it arrives, and one that
-- lands outside every handler fails the statement with an ERROR the
-- server logs. So this is a procedure called by CALL: a function called
-- by SELECT leaves the executor's check for a cancel after it returned,
-- which CALL does not make (cancels sent at random instants failed 9 of
-- 6,000 rounds by SELECT, none of 6,000 by CALL), and a cancel that
-- arrives once the statement is done is ignored. Every statement is
-- inside the round's block (no variable is initialized in DECLARE) and
-- every path ends in a RETURN inside it (PL/pgSQL adds a RETURN after a
-- block that catches errors, whose check for a cancel would be outside
-- it). And the handlers are inside a block of their own: the server
-- signals a backend twice for one cancel request (the process, then its
-- process group), and a loaded machine delivers the second on its own,
-- often just as the first one's handler begins (160 uncaught in 9,600
-- rounds of the crash watch, before it had this block; none after).
-- These two handlers also catch lock_not_available: a cancel that ends
-- the wait as its lock_timeout expires leaves the timeout's own signal
-- to land in the wait's handler. Only a cancel that reaches the statement
-- as it enters the procedure, before the first block, cannot be caught:
-- the client sends none to a wait younger than 50 ms (see cancelPlan).
-- A cancel caught anywhere answers 7 (busy: the caller looks the holder
-- up): a lock it took is a session lock the rollback keeps, and the next
-- round finds it held (3); a probe's shared lock it interrupted is
-- released (pgleader_unshare).
DECLARE
  w int;
  ok bool;
BEGIN
  BEGIN
    -- No wait's length unless this round's wait measured one.
    plan := NULL;
    code := pg_temp.pgleader_guard(pid, tok);
    IF code <> 0 THEN
      RETURN;
    END IF;
    code := 1;
    IF pg_temp.pgleader_mine(c, o, s) THEN
      code := 3;
    ELSE
      w := wait_ms;
      IF current_setting('log_lock_waits')::bool THEN
        w := least(w, (extract(epoch FROM current_setting('deadlock_timeout')::interval) * 800)::int);
      END IF;
      BEGIN
        PERFORM set_config('lock_timeout', greatest(w, 1)::text, true);
        -- The wait runs under EXPLAIN ANALYZE for its execution time, on
        -- the server's monotonic clock: it began after the round was sent
        -- and ended after the grant, so the round's send time plus it is
        -- no later than the grant's statement ended (the caller's trust
        -- window runs from there: see quiet.go). The plan goes back as the
        -- server wrote it, and the client reads its "Execution Time"
        -- (executionTime): parsed here, as json, it cost a backend that
        -- slept through the wait about 13 us more of every handover (a
        -- 2-core VM). A wait that did not end in a grant leaves plan NULL.
        EXECUTE 'EXPLAIN (ANALYZE, TIMING false, COSTS false, BUFFERS false, FORMAT JSON) SELECT pg_temp.pgleader_lock($1, $2, $3, ''wait'')'
          INTO plan USING c, o, s;
      EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
        -- A wait can time out at the instant of its grant; the session
        -- then holds the key.
        IF NOT pg_temp.pgleader_mine(c, o, s) THEN
          code := 0;
          RETURN;
        END IF;
      WHEN query_canceled THEN
        IF NOT pg_temp.pgleader_mine(c, o, s) THEN
          code := 7;
          RETURN;
        END IF;
      END;
    END IF;
    -- A grant's path, run by a backend that slept through the wait (its
    -- caches cold, every step many times slower than in a busy session):
    -- the common case, a free gate, is probed here with two calls, and the
    -- slot released with one, rather than through pgleader_reserved's and
    -- pgleader_lock's nested functions (about 0.05 ms less of a handover
    -- on a small VM); as assignments, which PL/pgSQL evaluates itself,
    -- rather than PERFORMs, each a query through SPI (one: about 5 us less
    -- at the median). A taken gate is checked as before; a cancel between
    -- the probe's two calls is pgleader_unshare's, as any probe's.
    IF gate IS NOT NULL AND NOT pg_try_advisory_lock_shared(1885817928, gate) THEN
      IF pg_temp.pgleader_reserved(gate, me) THEN
        PERFORM pg_temp.pgleader_lock(c, o, s, 'unlock');
        code := 6;
        RETURN;
      END IF;
    ELSIF gate IS NOT NULL THEN
      ok := pg_advisory_unlock_shared(1885817928, gate);
    END IF;
    IF heir IS NOT NULL THEN
      ok := pg_advisory_unlock(1885817928, heir);
    END IF;
    RETURN;
  EXCEPTION WHEN query_canceled OR lock_not_available THEN
    PERFORM pg_temp.pgleader_unshare(c, o, s, gate, me);
    code := 7;
    plan := NULL;
    RETURN;
  END;
EXCEPTION WHEN query_canceled OR lock_not_available THEN
  -- The same request's second signal, in a handler above.
  PERFORM pg_temp.pgleader_unshare(c, o, s, gate, me);
  code := 7;
  plan := NULL;
  RETURN;
END $f$;

CREATE OR REPLACE FUNCTION pg_temp.pgleader_poll(c oid, o oid, s int2, pid int4, tok text, slots int4[], lease_ms int, gate int4, me int4) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $f$
-- A watcher's poll, which never waits: take the key if it is free (1; 3
-- when this backend held it already; 6 when a reservation gives it
-- back), else a free heir slot (10 + i for slots[i + 1]), else 0. A lock
-- taken turns the session's idle_session_timeout (the lease) on.
DECLARE
  g int := pg_temp.pgleader_guard(pid, tok);
BEGIN
  IF g <> 0 THEN
    RETURN g;
  END IF;
  IF pg_temp.pgleader_mine(c, o, s) THEN
    RETURN 3;
  END IF;
  IF pg_temp.pgleader_lock(c, o, s, 'try') THEN
    IF pg_temp.pgleader_reserved(gate, me) THEN
      PERFORM pg_temp.pgleader_lock(c, o, s, 'unlock');
      RETURN 6;
    END IF;
    IF lease_ms IS NOT NULL THEN
      PERFORM set_config('idle_session_timeout', lease_ms::text, false);
    END IF;
    RETURN 1;
  END IF;
  FOR i IN 1 .. coalesce(array_length(slots, 1), 0) LOOP
    IF pg_temp.pgleader_lock(1885817928, slots[i]::oid, 2::int2, 'try') THEN
      PERFORM pg_temp.pgleader_warm(gate, me);
      IF lease_ms IS NOT NULL THEN
        PERFORM set_config('idle_session_timeout', lease_ms::text, false);
      END IF;
      RETURN 9 + i;
    END IF;
  END LOOP;
  RETURN 0;
END $f$;

CREATE OR REPLACE FUNCTION pg_temp.pgleader_wake(c oid, o oid, s int2, slots int4[], spare text) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $f$
-- A new leader, in its announcement's transaction (or after a Proclaim):
-- end the lock waits of the key's heirs (sessions queued on the key that
-- hold one of its heir slots), so that they look the new leader up now,
-- not at their wait's end (pgleader_wait catches the cancel and answers
-- 7). Only sessions of this database that this role may signal; nothing
-- else is touched. Returns how many were signalled; it never fails the
-- transaction it runs in (-1 when it could not look: the heirs then learn
-- the leader at their wait's end; -2 when spare does not wait for the
-- key).
-- A leader about to hand over to the candidate named spare (NULL: none)
-- ends the other heirs' waits only when that candidate waits for the key
-- behind another session than this one, and spares the candidate's: the
-- others queue again behind it, so that the server grants the lock the
-- leader releases to the candidate, not to an heir that would win it,
-- find the key reserved, and give it back. The server keeps the order,
-- so once is enough.
DECLARE
  n int := 0;
  p int4;
  db oid := (SELECT datid FROM pg_stat_get_activity(pg_backend_pid()));
  named int4[];
BEGIN
  IF spare IS NOT NULL THEN
    SELECT array_agg(l.pid) INTO named FROM pg_locks l JOIN pg_stat_get_activity(NULL) a ON a.pid = l.pid
      WHERE l.locktype = 'advisory' AND l.database = db AND l.classid = c AND l.objid = o AND l.objsubid = s AND NOT l.granted
        AND (a.application_name = spare OR (starts_with(a.application_name, spare || ' [')
          AND substr(a.application_name, length(spare) + 1) ~ '^ \[[PNO]-?[0-9]+( v?[0-9][0-9A-Za-z.+-]*)?\]$'));
    IF named IS NULL THEN
      RETURN -2;
    END IF;
    IF NOT EXISTS (SELECT FROM unnest(named) w, unnest(pg_blocking_pids(w)) b WHERE b <> pg_backend_pid()) THEN
      RETURN 0;
    END IF;
  END IF;
  FOR p IN WITH l AS MATERIALIZED (
        SELECT * FROM pg_locks WHERE locktype = 'advisory' AND database = db)
      SELECT w.pid FROM l w
      WHERE w.classid = c AND w.objid = o AND w.objsubid = s AND NOT w.granted AND w.pid <> pg_backend_pid()
        AND w.pid <> ALL (coalesce(named, '{}'))
        AND EXISTS (SELECT FROM l h WHERE h.pid = w.pid AND h.granted
          AND h.classid = 1885817928 AND h.objsubid = 2 AND h.objid = ANY (slots::oid[]))
  LOOP
    BEGIN
      IF pg_cancel_backend(p) THEN
        n := n + 1;
      END IF;
    EXCEPTION WHEN insufficient_privilege THEN
      NULL;
    END;
  END LOOP;
  RETURN n;
EXCEPTION WHEN OTHERS THEN
  RETURN -1;
END $f$;
