package group

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/pgleader/pgleader/leader"
)

// errLapsed is why a lapse ends the tenures: no round answered within the
// trust window.
var errLapsed = fmt.Errorf("%w: no round answered within the trust window", leader.ErrRenewDeadline)

// roundContext bounds a round's I/O by the trust window (deadline: its end
// while the member leads keys). At the window's end the member stops
// trusting its keys at once (lapse: every tenure ends, its OnElected's
// context cancelled), but the I/O goes on, and the session stays open,
// while an OnElected whose lock the session may still hold runs on (at
// most ReleaseTimeout): ending the session then would free those locks to
// another member while this one still acts, which is exactly what the
// trust window is there to prevent. A session already gone (the server
// ended it, a partition) has freed its locks whatever this side does, so
// keeping it open costs nothing there; a slow server's late answer keeps
// the session, and the locks are released or adopted only once their
// OnElected returned. A round whose read renews the window is bounded by
// the new one. The function returned ends the round's bound.
func (g *Group) roundContext(deadline time.Time) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var arm func(at time.Time) *time.Timer
	// settle follows a lapse: the I/O ends once the OnElected calls on
	// the session's locks have returned, unless a late answer renewed
	// the window meanwhile.
	settle := func(running []<-chan struct{}) {
		if !g.drained(ctx, running) {
			return
		}
		g.mu.Lock()
		end := g.st.trustEnd
		g.mu.Unlock()
		if time.Now().Before(end) {
			arm(end)
			return
		}
		cancel()
	}
	expire := func() *time.Timer {
		running, renewed, ok := g.lapse(ctx)
		switch {
		case !ok:
			return nil // the round ended
		case !renewed.IsZero():
			return arm(renewed) // the round's read renewed the window
		}
		return time.AfterFunc(0, func() { settle(running) })
	}
	arm = func(at time.Time) *time.Timer {
		return time.AfterFunc(time.Until(at), func() { expire() })
	}
	var first *time.Timer
	if time.Now().Before(deadline) {
		first = arm(deadline)
	} else {
		// Already past (the process ran late): the tenures end before the
		// round sends anything, whatever it then reads.
		first = expire()
	}
	return ctx, func() {
		if first != nil {
			first.Stop()
		}
		cancel()
	}
}

// lapse is the trust window's end in a round not answered yet. It reports
// !ok when the round ended meanwhile, and the window's new end when the
// round's read renewed it; otherwise it ends every tenure (OnElected's
// context is cancelled now; OnDemoted follows its return), keeps their
// locks as held without a tenure (the session may still hold them: they
// are adopted or released once OnElected returned, if a late answer keeps
// the session), and returns the OnElected calls still running on locks
// the session may hold.
func (g *Group) lapse(ctx context.Context) (running []<-chan struct{}, renewed time.Time, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if ctx.Err() != nil {
		return nil, time.Time{}, false
	}
	if time.Now().Before(g.st.trustEnd) {
		return nil, g.st.trustEnd, true
	}
	ended := 0
	for k, ks := range g.st.keys {
		switch {
		case ks.phase == phaseLeading || ks.phase == phaseHanding:
			g.end(k, ks, errLapsed)
			g.st.leftover(k)
			ended++
		case ks.phase != phaseEnding || !g.st.extra[k] || ks.tenure == nil:
			continue
		}
		if !ks.tenure.returned() {
			running = append(running, ks.tenure.done)
		}
	}
	if ended > 0 {
		g.log.Warn("no round answered within the trust window (RenewDeadline): every key is demoted now; the session stays open while their OnElected calls return, so that no other member takes a key meanwhile",
			zap.Int("keys", ended), zap.Int("still_running", len(running)))
	}
	return running, time.Time{}, true
}

// drained waits for the OnElected calls running to return, at most
// ReleaseTimeout; it reports false when the round ended meanwhile.
func (g *Group) drained(ctx context.Context, running []<-chan struct{}) bool {
	if len(running) == 0 {
		return ctx.Err() == nil
	}
	limit := time.NewTimer(g.cfg.ReleaseTimeout)
	defer limit.Stop()
	for _, done := range running {
		select {
		case <-done:
		case <-limit.C:
			return ctx.Err() == nil
		case <-ctx.Done():
			return false
		}
	}
	return ctx.Err() == nil
}
