package lockconn

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// UnsafeLease makes a Lease on conn without Open's setup (and its standby
// check), so that a test can prove each later layer on its own.
func UnsafeLease(conn *pgx.Conn) *Lease {
	return &Lease{conn: conn, sess: Session{PID: conn.PgConn().PID(), Major: ServerMajor(conn)}}
}

// TakeSlot makes the session t's heir on slot i, as a poll would.
func (l *Lease) TakeSlot(t *Target, i int) error {
	if _, err := l.conn.Exec(context.Background(), "SELECT pg_advisory_lock($1::int4, $2::int4)", Space, l.f.slots[i]); err != nil {
		return err
	}
	l.f.heir = i
	return nil
}

// HeirSlot is the heir slot the session holds for t (-1: none).
func (l *Lease) HeirSlot(t *Target) int32 {
	if l.f == nil || l.f.heir < 0 {
		return -1
	}
	return l.f.slots[l.f.heir]
}

// SetReservationBinds shortens how long a reservation binds; it returns
// the value before.
func SetReservationBinds(d time.Duration) time.Duration {
	old := reservationBinds
	reservationBinds = d
	return old
}

// Lookups is how many holder lookups the quiet campaign made.
func (l *Lease) Lookups() int { return l.lookups }

// CancelPlan is the crash watch's cancel decision.
var CancelPlan = cancelPlan

// IsCancelled reports a statement ended by a cancel request.
var IsCancelled = isCancelled

// CancelledOutside is Wait's answer to an error of its statement.
func (r *Ring) CancelledOutside(ctx context.Context, err error) (*bool, error) {
	return r.cancelledOutside(ctx, err)
}

// SetRingCancelAge changes how old a crash-watch wait must be before
// Cancel sends its request; it returns the value before.
func SetRingCancelAge(d time.Duration) time.Duration {
	old := ringCancelAge
	ringCancelAge = d
	return old
}

// GrantedFrom is grantedFrom, for its table test.
var GrantedFrom = grantedFrom

// ExecutionTime is executionTime, for its table test.
var ExecutionTime = executionTime

// WaitRound runs one heir's wait call (see runRound) and returns its code
// and the wait's length the call read.
func (l *Lease) WaitRound(ctx context.Context, t *Target) (int32, time.Duration, error) {
	return l.runRound(ctx, t, true)
}
