package timing

import (
	"context"
	"sync/atomic"
	"time"
)

// Bound bounds a statement on a session that holds a lock by the trust
// window's end (at). When the window closes with the statement unanswered,
// lapse runs once, at once (it stops the work the lock protects: an
// OnElected, a TryRun's fn), but the statement goes on, and the session
// stays open, until that work has returned (done closed) or limit has
// passed since the lapse (0: no limit); only then does ctx end. Ending the
// statement's context earlier would close the session (pgx closes a
// connection whose statement's context ends) and free the lock to another
// holder while the work still runs; a session already gone has freed it
// whatever this side does. A window already closed lapses before Bound
// returns. lapsed reports whether the window closed first; a statement
// that answers just as it closes is answered or lapsed, never both (end,
// which the caller runs once the statement returned, decides by a
// compare-and-swap).
func Bound(at time.Time, lapse func(), done <-chan struct{}, limit time.Duration) (ctx context.Context, lapsed func() bool, end func()) {
	ctx, cancel := context.WithCancel(context.Background())
	const running, answered, lapsedState = 0, 1, 2
	var state atomic.Int32
	settle := func() {
		var expired <-chan time.Time
		if limit > 0 {
			t := time.NewTimer(limit)
			defer t.Stop()
			expired = t.C
		}
		select {
		case <-done:
		case <-expired:
		case <-ctx.Done():
			return
		}
		cancel()
	}
	expire := func() bool {
		if !state.CompareAndSwap(running, lapsedState) {
			return false
		}
		lapse()
		return true
	}
	var timer *time.Timer
	if time.Now().Before(at) {
		timer = time.AfterFunc(time.Until(at), func() {
			if expire() {
				settle()
			}
		})
	} else {
		expire()
		timer = time.AfterFunc(0, settle)
	}
	return ctx, func() bool { return state.Load() == lapsedState }, func() {
		state.CompareAndSwap(running, answered)
		timer.Stop()
		cancel()
	}
}
