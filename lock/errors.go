package lock

import (
	"errors"
	"fmt"

	"github.com/pgleader/pgleader/leader"
)

// ErrHeld is matched (errors.Is) by a *HeldError: the lock is held by
// another session, so the work was skipped.
var ErrHeld = errors.New("pgleader: lock held by another session")

// HeldError reports that a key was held by someone else.
type HeldError struct {
	Key leader.Key
	// Holder is the session holding the key as seen right after the
	// attempt (zero when it was released in between).
	Holder leader.Backend
}

// Error names the key and, when known, its holder.
func (e *HeldError) Error() string {
	if e.Holder.PID == 0 {
		return fmt.Sprintf("pgleader: lock %s held by another session", e.Key)
	}
	who := e.Holder.Identity
	if who == "" {
		who = "a session"
	}
	return fmt.Sprintf("pgleader: lock %s held by %s (pid %d, user %s)", e.Key, who, e.Holder.PID, e.Holder.User)
}

// Unwrap makes errors.Is(err, ErrHeld) true.
func (e *HeldError) Unwrap() error { return ErrHeld }

// ErrNoDeadline is returned by Tx for a context without a deadline: a
// blocking lock wait must be bounded.
var ErrNoDeadline = errors.New("pgleader: lock.Tx needs a context with a deadline")

// ErrInProgress is returned by RunTx when another transaction holds the
// key: the same work is in progress elsewhere.
var ErrInProgress = errors.New("pgleader: in progress elsewhere")
