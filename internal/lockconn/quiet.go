package lockconn

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The quiet follower round. A plain lock wait that ends in lock_timeout is
// an ERROR the server logs with its statement, and a holder lookup reads
// pg_locks, which copies the whole lock table under every partition lock:
// a standing fleet of followers made both every second. Instead a follower
// calls a PL/pgSQL function of its own session (in pg_temp, which needs
// only the TEMP privilege every role has by default) that:
//
//   - refuses a server in recovery (4: ErrStandby);
//   - probes with a shared lock, taken with pg_try_advisory_lock_shared and
//     released at once: false means another session holds the lock, the
//     usual case, and costs no pg_locks read. True means the lock is free or
//     this backend holds it; only then it reads pg_locks for its own
//     backend, so that it never stacks (3: held before the round, which the
//     caller takes for a shared backend). The probe must not outlive
//     itself: followers that kept a shared lock into their exclusive wait
//     would block each other (the lock-upgrade deadlock), and as their
//     waits end before the deadlock detector runs, nobody would be elected;
//   - waits for the lock with lock_timeout below the server's
//     deadlock_timeout, so the deadlock detector never runs for it (1: won);
//   - catches lock_not_available, which the server does not log, and settles
//     a grant that raced the timeout the same way: the probe, then pg_locks
//     only when the lock is free or ours (1: won; 0: busy).
//
// Followers learn the leader from the NOTIFY each new leader sends on the
// key's channel with its confirm, read between rounds, instead of from
// pg_locks. When the function cannot be created (no TEMP privilege, a
// read-only session), the session keeps the plain round.
const quietFuncs = `
CREATE OR REPLACE FUNCTION pg_temp.pgleader_wait(k int8, c oid, o oid, s int2, wait_ms int) RETURNS int
LANGUAGE plpgsql AS $f$
BEGIN
  IF pg_is_in_recovery() THEN
    RETURN 4;
  END IF;
  IF (pg_try_advisory_lock_shared(k) AND pg_advisory_unlock_shared(k)) AND EXISTS (SELECT FROM pg_locks l WHERE l.locktype = 'advisory'
      AND l.classid = c AND l.objid = o AND l.objsubid = s AND l.granted AND l.mode = 'ExclusiveLock' AND l.pid = pg_backend_pid()) THEN
    RETURN 3;
  END IF;
  BEGIN
    PERFORM set_config('lock_timeout', wait_ms::text, true);
    PERFORM pg_advisory_lock(k);
    RETURN 1;
  EXCEPTION WHEN lock_not_available THEN
    IF (pg_try_advisory_lock_shared(k) AND pg_advisory_unlock_shared(k)) AND EXISTS (SELECT FROM pg_locks l WHERE l.locktype = 'advisory'
        AND l.classid = c AND l.objid = o AND l.objsubid = s AND l.granted AND l.mode = 'ExclusiveLock' AND l.pid = pg_backend_pid()) THEN
      RETURN 1;
    END IF;
    RETURN 0;
  END;
END $f$;
CREATE OR REPLACE FUNCTION pg_temp.pgleader_wait(a int4, b int4, c oid, o oid, s int2, wait_ms int) RETURNS int
LANGUAGE plpgsql AS $f$
BEGIN
  IF pg_is_in_recovery() THEN
    RETURN 4;
  END IF;
  IF (pg_try_advisory_lock_shared(a, b) AND pg_advisory_unlock_shared(a, b)) AND EXISTS (SELECT FROM pg_locks l WHERE l.locktype = 'advisory'
      AND l.classid = c AND l.objid = o AND l.objsubid = s AND l.granted AND l.mode = 'ExclusiveLock' AND l.pid = pg_backend_pid()) THEN
    RETURN 3;
  END IF;
  BEGIN
    PERFORM set_config('lock_timeout', wait_ms::text, true);
    PERFORM pg_advisory_lock(a, b);
    RETURN 1;
  EXCEPTION WHEN lock_not_available THEN
    IF (pg_try_advisory_lock_shared(a, b) AND pg_advisory_unlock_shared(a, b)) AND EXISTS (SELECT FROM pg_locks l WHERE l.locktype = 'advisory'
        AND l.classid = c AND l.objid = o AND l.objsubid = s AND l.granted AND l.mode = 'ExclusiveLock' AND l.pid = pg_backend_pid()) THEN
      RETURN 1;
    END IF;
    RETURN 0;
  END;
END $f$;`

// Channel is the NOTIFY channel of a lock: a new leader announces its
// identity there.
func (t *Target) Channel() string {
	return fmt.Sprintf("pgleader.%d.%d.%d", t.ClassID, t.ObjID, t.ObjSubID)
}

// quietCall is the call of the wait function, with the lock's arguments.
func (t *Target) quietCall() string {
	n := 2
	if t.ObjSubID == 2 {
		n = 3
	}
	return fmt.Sprintf("SELECT pg_temp.pgleader_wait(%s, %d::oid, %d::oid, %d::int2, $%d::int4)", t.Args, t.ClassID, t.ObjID, t.ObjSubID, n)
}

// Watch prepares the session to campaign quietly for t, with rounds that
// wait at most wait: it creates the wait function (the first time in the
// session) and listens on t's channel, in one round trip, and reports
// whether the quiet round is on. In a second round trip it returns the
// holder seen now (one pg_locks read per connection), for Leader() before
// the first notification. When the function cannot be created the session
// keeps the plain round, and that is no error.
func (l *Lease) Watch(ctx context.Context, t *Target, wait time.Duration) (quiet bool, holder string, err error) {
	listen := "LISTEN " + pgx.Identifier{t.Channel()}.Sanitize()
	switch {
	case !l.quietTried:
		// One implicit transaction: when the functions cannot be created,
		// the LISTEN is rolled back with them.
		l.quietTried = true
		_, qerr := l.conn.Exec(ctx, quietFuncs+"\n"+listen, pgx.QueryExecModeSimpleProtocol)
		if qerr != nil && ctx.Err() != nil {
			return false, "", qerr
		}
		l.quiet = qerr == nil
	case l.quiet:
		if _, err := l.conn.Exec(ctx, listen, pgx.QueryExecModeSimpleProtocol); err != nil {
			return false, "", err
		}
	}
	t.wait, t.quietSQL = wait, t.quietCall()
	holder, _, _, err = scanHolder(l.conn.QueryRow(ctx, t.holderSQL))
	if err != nil {
		return false, "", err
	}
	return l.quiet, holder, nil
}

// quietCampaign runs one quiet round (see quietFuncs).
func (l *Lease) quietCampaign(ctx context.Context, t *Target) (Round, error) {
	var code int32
	args := append(append([]any{}, t.Vals...), int32(max(1, t.wait.Milliseconds())))
	if err := l.conn.QueryRow(ctx, t.quietSQL, args...).Scan(&code); err != nil {
		return Round{}, Pooling(err)
	}
	rd := Round{Holder: l.notified(t)}
	switch code {
	case 1:
		rd.Held = true
	case 3:
		rd.Held, rd.Already = true, true
	case 4:
		return rd, ErrStandby
	default:
		rd.Busy = true
	}
	return rd, nil
}

// notified drains the notifications received so far and returns the
// latest leader announced on t's channel ("" when none).
func (l *Lease) notified(t *Target) string {
	latest := ""
	for {
		// With a done context this returns a buffered notification, or
		// nothing at once, without touching the connection.
		n, _ := l.conn.WaitForNotification(doneCtx)
		if n == nil {
			return latest
		}
		if n.Channel == t.Channel() && n.Payload != "" {
			latest = n.Payload
		}
	}
}

// doneCtx is a context that has already ended.
var doneCtx = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()
