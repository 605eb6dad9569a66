package lock

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/pgleader/pgleader/leader"
)

// errLapsed is the cause of fn's context when no check answered within
// the trust window; errAnsweredLate is TryRun's error when the check then
// did answer (the lock held all along, but fn was cancelled).
var (
	errLapsed       = fmt.Errorf("%w: no check answered within the trust window", leader.ErrRenewDeadline)
	errAnsweredLate = fmt.Errorf("%w: a check answered after the trust window closed", leader.ErrRenewDeadline)
)

// renewBound bounds a check by the trust window's end (at). When the
// window closes with the check unanswered, lapse runs at once (it cancels
// fn), but the check goes on, and the session stays open, until fn has
// returned (fnDone): closing the session then would free the lock to
// another TryRun while this fn still runs. A session already gone has
// freed the lock whatever this side does. It returns the check's context,
// whether the window lapsed, and the function that ends the bound; a
// check that answers just as the window closes is answered or lapsed,
// never both.
func renewBound(at time.Time, fnDone context.Context, lapse func()) (context.Context, func() bool, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	const running, answered, lapsedState = 0, 1, 2
	var state atomic.Int32
	timer := time.AfterFunc(time.Until(at), func() {
		if !state.CompareAndSwap(running, lapsedState) {
			return
		}
		lapse()
		select {
		case <-fnDone.Done():
			cancel()
		case <-ctx.Done():
		}
	})
	return ctx, func() bool { return state.Load() == lapsedState }, func() {
		state.CompareAndSwap(running, answered)
		timer.Stop()
		cancel()
	}
}
