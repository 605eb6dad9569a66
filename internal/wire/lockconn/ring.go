package lockconn

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
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
	r.inCall = true
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.inCall = false
		r.mu.Unlock()
	}()
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.wait+slack)
	defer cancel()
	err = r.conn.QueryRow(wctx, statement("ring", "wait"), Space, MemberLock(r.group, target),
		int32(max(1, r.wait.Milliseconds()))).Scan(&gone)
	return gone, err
}

// Cancel ends a wait in progress with a cancel request, which the function
// catches (no log line). Only a wait in progress is cancelled: a cancel
// that reached the idle backend would do nothing.
func (r *Ring) Cancel() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.inCall {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		r.conn.PgConn().CancelRequest(cctx)
	}
}
