package lockconn

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The crash watch's session (package group). A member that dies (SIGKILL,
// OOM, a crashed node whose kernel still closes the socket) loses its locks
// at once: the server ends its backend when the socket closes. Each member
// holds a member lock of its own (MemberLock, exclusive, on its main
// session), and its second session, the watch, waits in share mode on the
// member lock of the next member in name order (a ring). The watched
// member's death grants the wait. The watch is quiet like a follower: its
// wait runs in a session function (sql/ring.sql) that catches lock_timeout
// (no server log line), and each wait is shorter than deadlock_timeout. It
// holds nothing when it returns. It takes no part in safety: a watch that
// fails only delays detection to the next round.

// Ring is a crash watch's session.
type Ring struct {
	conn  *pgx.Conn
	group string
	// wait is one wait's length: under the server's deadlock_timeout.
	wait time.Duration

	mu     sync.Mutex
	inCall bool
	began  time.Time // when the call in progress was sent
	call   uint64    // counts calls, so that a delayed Cancel ends only its own
	// cancelled: the call a request was sent to (one per call)
	cancelled uint64
}

// A cancel request ends a wait only when it reaches the backend inside the
// session procedure, whose handlers catch it (no log line). One that
// arrives before the statement is ignored by the server (the wait runs its
// length); one that arrives as the statement enters the procedure, before
// its first handler, fails the statement with an ERROR the server logs.
// So Cancel (and a stopping heir: see cancelOnDone) sends at most one
// request per wait, only to a wait sent ringCancelAge ago or more (it
// reached the backend by then, on any machine not paused), and none to a
// wait that ends by itself within ringCancelMargin or an eighth of its
// length: a request then would gain little. A request that still arrives
// outside the procedure costs the log line and nothing else (Wait clears
// the session and answers "not gone").
var (
	ringCancelAge    = 50 * time.Millisecond
	ringCancelMargin = 50 * time.Millisecond
)

// cancelPlan decides a cancel request for a wait of length wait sent age
// ago: send it after delay, or send none.
func cancelPlan(age, wait time.Duration) (delay time.Duration, send bool) {
	delay = max(0, ringCancelAge-age)
	return delay, wait-(age+delay) >= max(ringCancelMargin, wait/8)
}

// NewRing creates the watch's function on a session set up with Setup.
// wait bounds each wait; it is cut to four fifths of deadlock_timeout.
func NewRing(ctx context.Context, conn *pgx.Conn, sess Session, group string, wait time.Duration) (*Ring, error) {
	if _, err := conn.Exec(ctx, statement("ring", "function"), pgx.QueryExecModeSimpleProtocol); err != nil {
		return nil, err
	}
	if sess.DeadlockTimeout > 0 {
		wait = min(wait, sess.DeadlockTimeout*4/5)
	}
	return &Ring{conn: conn, group: group, wait: max(wait, time.Millisecond)}, nil
}

// Close ends the session.
func (r *Ring) Close() { Close(r.conn) }

// Wait waits, up to the ring's wait, for the member lock of target: gone
// reports that its holder is gone. A nil gone: the server is a standby.
// The wait ends by itself, or by Cancel (caught in the function, no log
// line); its client-side deadline, the wait plus slack, only catches a
// silent network.
func (r *Ring) Wait(ctx context.Context, target string, slack time.Duration) (gone *bool, err error) {
	r.mu.Lock()
	if ctx.Err() != nil {
		r.mu.Unlock()
		return nil, ctx.Err()
	}
	r.inCall, r.began = true, time.Now()
	r.call++
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.inCall = false
		r.mu.Unlock()
	}()
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.wait+slack)
	defer cancel()
	// A prepared statement: parsed anew for each wait, its start would
	// give a cancel request more time to land before the procedure.
	err = r.conn.QueryRow(wctx, statement("ring", "wait"), pgx.QueryExecModeCacheStatement, Space, MemberLock(r.group, target),
		int32(max(1, r.wait.Milliseconds()))).Scan(&gone)
	if err != nil && wctx.Err() == nil {
		return r.cancelledOutside(wctx, err)
	}
	return gone, err
}

// cancelledOutside turns a cancel request that reached the wait's
// statement outside the session function (see ringCancelAge) into what the
// function would have answered, "not gone": the session stays fit (the
// statement ran in a transaction of its own), but the request may have
// come while the function's handler was about to release a shared lock the
// wait was granted, which a session lock outlives an error with; kept, it
// would block the watched member's next session from its member lock. So
// every lock of the watch's session is released first. Cancel sends one
// request per wait, but any session of the role may send more (the
// server's pg_cancel_backend); so a release that a request failed is
// tried again, three times in all (a release is the same done twice). Any
// other error is returned as it is.
func (r *Ring) cancelledOutside(ctx context.Context, err error) (*bool, error) {
	if !isCancelled(err) {
		return nil, err
	}
	for try := 1; ; try++ {
		_, err := r.conn.Exec(ctx, "SELECT pg_catalog.pg_advisory_unlock_all()", pgx.QueryExecModeExec)
		if err == nil {
			break
		}
		if !isCancelled(err) || try == 3 {
			return nil, err
		}
	}
	gone := false
	return &gone, nil
}

// isCancelled reports a statement ended by a cancel request
// (query_canceled).
func isCancelled(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "57014"
}

// Cancel ends a wait in progress with a cancel request, which the function
// catches (no log line), and reports whether it sent one. It sends at most
// one per wait; to a wait sent less than ringCancelAge ago, only once it
// is that old (Cancel sleeps until then); and none to a wait that ends by
// itself soon (see cancelPlan), which then ends within its length as
// always.
func (r *Ring) Cancel() bool {
	r.mu.Lock()
	if !r.inCall || r.cancelled == r.call {
		r.mu.Unlock()
		return false
	}
	call := r.call
	delay, send := cancelPlan(time.Since(r.began), r.wait)
	r.mu.Unlock()
	if !send {
		return false
	}
	if delay > 0 {
		time.Sleep(delay)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.inCall || r.call != call || r.cancelled == call {
		return false
	}
	r.cancelled = call
	cctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return r.conn.PgConn().CancelRequest(cctx) == nil
}
