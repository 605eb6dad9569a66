package elector

import (
	"context"
	"errors"
	"fmt"

	"github.com/pgleader/pgleader/internal/wire/timing"
	"github.com/pgleader/pgleader/leader"
)

// errLapsed is why a tenure ends when no renew answered within its trust
// window; errAnsweredLate, when the renew in flight then did answer (the
// session lives and holds the lock: stepDown drains, renewing until
// OnElected returned, then unlocks).
var (
	errLapsed       = fmt.Errorf("%w: no renew answered within the trust window", leader.ErrRenewDeadline)
	errAnsweredLate = fmt.Errorf("%w: the renew answered after the trust window closed", leader.ErrRenewDeadline)
)

// renewContext bounds a renew, or any other statement on a leading
// session (a value's write, a resign request's look-ups and answer, a
// reservation), by t's trust window. When the window closes with the
// statement unanswered, the leader stops trusting the lock at once
// (lapse: IsLeader turns false, OnElected's context is cancelled with
// ErrRenewDeadline), but the statement goes on, and the session stays
// open, until OnElected has returned (at most ReleaseTimeout): closing the
// session then would free the lock to another candidate while this
// leader's OnElected still works, which the trust window is there to
// prevent. A session already gone (the server ended it, a partition) has
// freed the lock whatever this side does, so keeping it costs nothing
// there (a statement whose own context ended would close the session:
// pgx does that). It returns the context, whether the window lapsed, and
// the function that ends the bound. A caller that is not a renew may
// ignore the lapse: OnElected, cancelled, returns with the lapse as its
// cause, and the next renew, its window closed, ends the tenure.
//
// The bound is the window's end, not RenewDeadline from the statement's
// send: a statement that would outlast the window has no answer the
// leader could still trust.
func (e *Elector) renewContext(t *tenure) (context.Context, func() bool, func()) {
	return timing.Bound(t.trust.closes(), func() {
		// IsLeader turns false; Status().Tenure stays true until
		// stepDown, so that a leader wedged here is not live (health).
		e.trustUntil.Store(0)
		t.cancel(errLapsed)
	}, t.cbDone, e.cfg.ReleaseTimeout)
}

// lapsedHandover is the reason a preference handover ends the tenure
// with: a window that closed under its statements (a candidate's look-up,
// the reservation) ended the tenure first, and then the reason is that
// (errAnsweredLate: they answered, the session lives, stepDown drains),
// not a resign. Other reasons (faults) stand.
func lapsedHandover(t *tenure, reason error) error {
	if errors.Is(reason, leader.ErrResigned) && errors.Is(context.Cause(t.ctx), errLapsed) {
		return errAnsweredLate
	}
	return reason
}
