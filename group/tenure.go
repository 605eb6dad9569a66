package group

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/pgleader/pgleader/internal/wire/timing"
	"github.com/pgleader/pgleader/leader"
)

// begin starts a key's tenure (g.mu held): leading from now. Its
// OnElected runs in a goroutine of its own, started by launch once g.mu
// is released: starting thousands of goroutines (a failover at 100,000
// keys begins ~16,700 tenures per survivor) takes hundreds of
// milliseconds, which Status, IsLeader, the notifications and the trust
// window's lapse would otherwise wait out.
func (g *Group) begin(ks *keyState, pid uint32, term int64) *tenure {
	l := leader.Leadership{Key: ks.key, Identity: g.cfg.Identity, Term: term, ElectedAt: time.Now(), BackendPID: pid}
	if g.cfg.Fencing.Enabled {
		l.TermsTable = g.termsTable
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	t := &tenure{l: l, ctx: ctx, cancel: cancel, done: make(chan struct{}), demoted: make(chan struct{})}
	ks.phase, ks.tenure = phaseLeading, t
	g.stats.elected++
	g.wg.Add(1)
	return t
}

// launch starts the OnElected of tenures begun (g.mu not held). A tenure
// that ended meanwhile (a lapse, a stop) starts all the same, with its
// context already cancelled: its end waits for it to return.
func (g *Group) launch(ts []*tenure) {
	for _, t := range ts {
		go func() {
			defer g.wg.Done()
			defer g.poke() // a hand-over waits for this
			defer close(t.done)
			g.cfg.Callbacks.OnElected(t.ctx, t.l)
		}()
		if ce := g.log.Check(zap.DebugLevel, "elected"); ce != nil {
			ce.Write(zap.Stringer("key", t.l.Key), zap.Int64("term", t.l.Term))
		}
	}
}

// handOver begins a graceful hand-over of a leading key (g.mu held): its
// OnElected's context is cancelled with reason; the lock stays held, and
// renewed, until it returns or ReleaseTimeout passes.
func (g *Group) handOver(ks *keyState, reason error) {
	if ks.phase != phaseLeading {
		return
	}
	t := ks.tenure
	ks.phase, t.reason, t.releaseAt = phaseHanding, reason, time.Now().Add(g.cfg.ReleaseTimeout)
	t.cancel(reason)
	g.log.Debug("handing over", zap.Stringer("key", t.l.Key), zap.NamedError("reason", reason))
}

// end ends a key's tenure (g.mu held): its context is cancelled at once,
// and OnDemoted runs on a goroutine of its own once OnElected has returned
// (or ReleaseTimeout passed); until then the key is ending, and not taken
// again.
func (g *Group) end(k tag, ks *keyState, reason error) {
	t := ks.tenure
	g.log.Debug("demoted", zap.Stringer("key", t.l.Key), zap.NamedError("reason", reason))
	ks.phase = phaseEnding
	g.stats.demoted[leader.ReasonLabel(reason)]++
	t.cancel(reason)
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		if !timing.WaitUntil(t.done, time.Now().Add(g.cfg.ReleaseTimeout)) {
			g.log.Error("OnElected did not return within ReleaseTimeout after its context was cancelled", zap.Stringer("key", t.l.Key))
		}
		if g.cfg.Callbacks.OnDemoted != nil {
			g.cfg.Callbacks.OnDemoted(t.l, reason)
		}
		g.mu.Lock()
		if ks.tenure == t {
			ks.phase, ks.tenure = phaseFree, nil
			if !ks.inSet {
				delete(g.st.keys, k)
			}
		}
		g.mu.Unlock()
		close(t.demoted)
		g.poke()
	}()
}

// demoteAll ends every tenure when the session ends: after a fault the
// locks are gone with it. A key still handing over lost its lock before
// its OnElected returned: OnDemoted gets the fault, not the graceful
// reason, as an Elector's does (only the stop's own cancel keeps it).
func (g *Group) demoteAll(err error) {
	own := err == nil || errors.Is(err, context.Canceled)
	err = sessionEnd(err)
	g.mu.Lock()
	defer g.mu.Unlock()
	for k, ks := range g.st.keys {
		if ks.phase != phaseLeading && ks.phase != phaseHanding {
			continue
		}
		reason := err
		if ks.phase == phaseHanding && g.st.stopping && own {
			reason = ks.tenure.reason
		}
		g.end(k, ks, reason)
	}
	g.st.trustEnd = time.Time{}
	g.st.extra, g.st.doubt = nil, nil // gone with the session
}

// sessionEnd names why a session's end ended its tenures.
func sessionEnd(err error) error {
	switch {
	case err == nil:
		return leader.ErrConnectionLost
	case errors.Is(err, leader.ErrConnectionLost), errors.Is(err, leader.ErrRenewDeadline), errors.Is(err, leader.ErrStandby),
		errors.Is(err, leader.ErrTransactionPooling), errors.Is(err, leader.ErrLockLost), errors.Is(err, leader.ErrNoTermsTable),
		errors.Is(err, leader.ErrReadOnly), errors.Is(err, ErrLockTable), errors.Is(err, context.Canceled):
		return err
	default:
		// Anything else on the wire (a server shutting down sends FATAL
		// 57P01 to a statement in flight) ended the session.
		return fmt.Errorf("%w: %w", leader.ErrConnectionLost, err)
	}
}
