-- The group's crash watch (see ring.go): a second session per member that
-- waits, in share mode, on the member lock of the next member in the ring.

-- name: function
CREATE OR REPLACE PROCEDURE pg_temp.pgleader_ring(a int4, b int4, wait_ms int, OUT gone bool)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $f$
-- Wait up to wait_ms (under deadlock_timeout: no deadlock detector run)
-- for the member lock (a, b) in share mode; report whether its holder is
-- gone; hold nothing on return. lock_not_available is caught (no line in
-- the server's log). NULL on a standby. A procedure called by CALL, with
-- every statement inside a block that catches a cancel, and its handler
-- inside another (see pgleader_wait in quiet.sql): once the statement is
-- in the procedure, a cancel request lands nowhere the server would log
-- it (Cancel sends none sooner: see ring.go).
BEGIN
  BEGIN
    IF pg_is_in_recovery() THEN
      gone := NULL;
      RETURN;
    END IF;
    BEGIN
      PERFORM set_config('lock_timeout', wait_ms::text, true);
      PERFORM pg_advisory_lock_shared(a, b);
    EXCEPTION WHEN lock_not_available THEN
    END;
    gone := pg_try_advisory_lock_shared(a, b);
    PERFORM pg_advisory_unlock_all();
    RETURN;
  EXCEPTION WHEN query_canceled OR lock_not_available THEN
    -- The member stops, or its successor changed: the cancel request ends
    -- the wait without an error in the server log.
    PERFORM pg_advisory_unlock_all();
    gone := false;
    RETURN;
  END;
EXCEPTION WHEN query_canceled OR lock_not_available THEN
  -- The same request's second signal, or the wait's lock_timeout that
  -- expired as the cancel ended it, in the handler above (see
  -- pgleader_wait in quiet.sql).
  PERFORM pg_advisory_unlock_all();
  gone := false;
  RETURN;
END $f$

-- name: wait
CALL pg_temp.pgleader_ring($1, $2, $3, NULL)
