package leader

import (
	"context"
	"errors"

	"github.com/pgleader/pgleader/internal/lockconn"
)

// Reasons for a demotion, handed to OnDemoted and set as the cause of the
// OnElected context (see context.Cause). Test them with errors.Is.
var (
	// ErrConnectionLost: the connection that held the lock broke or the
	// server ended the session (pg_terminate_backend, a restart, the
	// server-side lease). The lock is gone with the session.
	ErrConnectionLost = lockconn.ErrConnectionLost
	// ErrLockLost: the connection answered, but its backend no longer holds
	// the lock (for example pg_advisory_unlock_all ran on it). A DISCARD ALL
	// also wipes the session token, which reads as ErrTransactionPooling.
	ErrLockLost = lockconn.ErrLockLost
	// ErrRenewDeadline: no renew succeeded within the trust window
	// (RenewDeadline), so leadership is in doubt.
	ErrRenewDeadline = lockconn.ErrRenewDeadline
	// ErrResigned: the leader resigned (Resign was called).
	ErrResigned = errors.New("pgleader: resigned")
	// ErrCallbackReturned: OnElected returned on its own; the elector
	// resigned and campaigns again.
	ErrCallbackReturned = errors.New("pgleader: OnElected returned")
)

// Errors about the environment. They are not retried.
var (
	// ErrTransactionPooling: the connection goes through a pooler in
	// transaction (or statement) mode, such as PgBouncer with
	// pool_mode=transaction. Session advisory locks cannot work there:
	// connect directly to PostgreSQL, or through a pool in session mode.
	ErrTransactionPooling = lockconn.ErrTransactionPooling
	// ErrNotLeader is returned by calls that need leadership when there is none.
	ErrNotLeader = errors.New("pgleader: not the leader")
)

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
