package leader

import (
	"context"
	"errors"
	"fmt"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/internal/wire/terms"
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
	// ErrStandby: the server is a hot standby (pg_is_in_recovery()). Advisory
	// locks work there but do not exclude the primary's holders, so nothing
	// in pgleader takes or keeps a lock on a standby. Connect to the
	// primary, or list every host in the DSN with target_session_attrs=
	// primary (DSN does that for multi-host strings that name no
	// target_session_attrs). An elector keeps retrying: standbys get
	// promoted, and a multi-host DSN finds the new primary.
	ErrStandby = lockconn.ErrStandby
	// ErrReadOnly: with fencing on, the database refused to write the terms
	// table because the session is read-only (SQLSTATE 25006:
	// default_transaction_read_only for the role or database). Not retried.
	ErrReadOnly = terms.ErrReadOnly
	// ErrRejected: the server refused a DSN connector's login for a reason
	// the same connection string cannot get past: authentication failed
	// (SQLSTATE 28P01, 28000: wrong password, unknown role, no pg_hba.conf
	// entry) or the database does not exist (3D000). The *pgconn.PgError
	// stays in the chain. Not retried; a custom Connector's errors are
	// retried, since it may fetch fresh credentials each time.
	ErrRejected = errors.New("pgleader: the server rejected the connection")
	// ErrUnsupportedServer: the server is older than PostgreSQL 14, which
	// added idle_session_timeout, the server-side lease that frees a
	// paused or partitioned leader's lock (TCP keepalives do not end a
	// session behind a TCP proxy, and a paused process's kernel answers
	// them). Not retried. lock.Tx, TryTx and RunTx, whose locks end with
	// their transaction, work on any version.
	ErrUnsupportedServer = lockconn.ErrUnsupportedServer
)

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// Errors of a resign request (elector.RequestResign, pgleader resign).
var (
	// ErrNoLeader: nobody holds the key.
	ErrNoLeader = errors.New("pgleader: no leader")
	// ErrNotCandidate: the named identity does not stand for the key.
	ErrNotCandidate = errors.New("pgleader: no such candidate")
	// ErrRefused: the leader refused the request; the error says why (the
	// asker's role may not ask, the leader takes no requests, or it could
	// not reserve the lock for the named candidate).
	ErrRefused = errors.New("pgleader: resign request refused")
	// ErrNoAnswer: the leader did not answer in time (it runs a pgleader
	// without resign requests, or its process is paused).
	ErrNoAnswer = errors.New("pgleader: the leader did not answer")
)

// Errors about fencing terms.

// ErrFenced is returned by Fence when a newer term exists: a later leader
// has been elected, and the caller must not write.
var ErrFenced = errors.New("pgleader: fenced: a newer leader's term exists")

// ErrNoTermsTable means fencing is on but the terms table is missing or not
// accessible. The error text carries the SQL that creates it.
var ErrNoTermsTable = terms.ErrNoTable

// ErrForeignTable means the terms or history table exists but belongs to a
// role the elector's role is not a member of (on a shared database another
// role may create it first): its owner could rewrite the terms, so it is
// refused. Drop it, or name its owner in Fencing.TrustedOwner. Not retried.
var ErrForeignTable = terms.ErrForeignTable

// ErrNoFencing is returned by Leadership.Fence when the elector runs without
// fencing (the Leadership has no term).
var ErrNoFencing = errors.New("pgleader: fencing is not enabled for this election")

// FencedError is the error Fence returns for a stale term. It matches
// ErrFenced with errors.Is.
type FencedError struct {
	Key     Key
	Term    int64 // the caller's term
	Current int64 // the newest term in the table
}

// Error says which term is stale and which is current.
func (e *FencedError) Error() string {
	return fmt.Sprintf("pgleader: fenced: key %s: term %d is stale, the current term is %d", e.Key, e.Term, e.Current)
}

// Unwrap makes errors.Is(err, ErrFenced) true.
func (e *FencedError) Unwrap() error { return ErrFenced }

// ErrInvalidConfig is wrapped by every error elector.New, group.New and
// the lock package return for a bad configuration.
var ErrInvalidConfig = errors.New("pgleader: invalid config")

// ConfigError names the configuration field that is wrong and the rule it
// breaks. It wraps ErrInvalidConfig.
type ConfigError struct {
	Field string
	Rule  string
}

// Error names the field and the rule.
func (e *ConfigError) Error() string {
	return fmt.Sprintf("pgleader: invalid config: %s: %s", e.Field, e.Rule)
}

// Unwrap makes errors.Is(err, ErrInvalidConfig) true.
func (e *ConfigError) Unwrap() error { return ErrInvalidConfig }
