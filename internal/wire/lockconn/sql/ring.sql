-- The group's crash watch (see ring.go): a second session per member that
-- waits, in share mode, on the member lock of the next member in the ring.

-- name: function
CREATE OR REPLACE FUNCTION pg_temp.pgleader_ring(a int4, b int4, wait_ms int) RETURNS bool
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $f$
-- Wait up to wait_ms (under deadlock_timeout: no deadlock detector run)
-- for the member lock (a, b) in share mode; report whether its holder is
-- gone; hold nothing on return. lock_not_available is caught (no line in
-- the server's log). NULL on a standby.
DECLARE
  gone bool;
BEGIN
  IF pg_is_in_recovery() THEN
    RETURN NULL;
  END IF;
  BEGIN
    PERFORM set_config('lock_timeout', wait_ms::text, true);
    PERFORM pg_advisory_lock_shared(a, b);
  EXCEPTION WHEN lock_not_available THEN
  END;
  gone := pg_try_advisory_lock_shared(a, b);
  PERFORM pg_advisory_unlock_all();
  RETURN gone;
EXCEPTION WHEN query_canceled THEN
  -- The member stops, or its successor changed: the cancel request ends
  -- the wait without an error in the server log.
  PERFORM pg_advisory_unlock_all();
  RETURN false;
END $f$

-- name: wait
SELECT pg_temp.pgleader_ring($1, $2, $3)
