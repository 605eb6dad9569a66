package group

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/internal/wire/timing"
	"github.com/pgleader/pgleader/leader"
)

// The crash watch (lockconn.Ring): a second session per member waits on
// the member lock of the next member in name order. When that member dies,
// the wait is granted, and the watch has its own member run a full round
// at once, which tells the group from the member's main session (whose pid
// the others know, so that they believe it); every member then runs a
// round. The watch takes no part in safety: keys are taken, as always, by
// try-locks on the main session after a round that read the roster.

// startWatch starts the crash watch for one session of the member; the
// function it returns stops it.
func (g *Group) startWatch(ctx context.Context) (stop func()) {
	wctx, cancel := context.WithCancel(ctx)
	ring := make(chan string, 1)
	g.mu.Lock()
	g.ring, g.ringLast = ring, ""
	g.mu.Unlock()
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		g.watchRing(wctx, ring)
	}()
	return cancel
}

// withoutGone is the members a scan read, less those reported gone and
// still listed (g.mu held): a member's backend may still be releasing its
// locks, its roster lock among them, while the others already took its
// keys (see memberGone); listing it again would hand them back, and the
// keys its backend had not released yet would wait for the next periodic
// scan. While one is still listed, another scan runs soon, after as long
// again as the report's age (5 ms at least): a member that takes long to
// go costs a few scans, not hundreds. A member still listed RenewDeadline
// after it was reported gone is listed again (the report was wrong, or its
// session came back with the same identity).
func (g *Group) withoutGone(members []string, sent time.Time) []string {
	out := members
	for m, at := range g.gone {
		switch {
		case !slices.Contains(out, m) || sent.Sub(at) > g.cfg.RenewDeadline:
			delete(g.gone, m)
		default:
			g.soon, g.soonWait = true, max(g.soonWait, sent.Sub(at))
			out = slices.DeleteFunc(slices.Clone(out), func(s string) bool { return s == m })
		}
	}
	return out
}

// watchNext points the crash watch at the ring successor (g.mu held).
func (g *Group) watchNext() {
	if g.ring == nil {
		return
	}
	if next := ringNext(g.st.members, g.cfg.Identity); next != g.ringLast {
		g.ringLast = next
		select {
		case <-g.ring: // replace a target not yet read
		default:
		}
		g.ring <- next
	}
}

// reportGone has the next round run at once, and tell the group that
// member is gone.
func (g *Group) reportGone(member string) {
	g.mu.Lock()
	g.goneOut = append(g.goneOut, lockconn.GroupMessage{Kind: lockconn.GroupGone, Member: member})
	g.fullSoon = true
	g.memberGone(member)
	g.mu.Unlock()
	g.poke()
}

// memberGone takes a member out of the members at once (g.mu held): the
// crash watch saw its member lock freed, or the member itself (or the
// member watching it) said so from a session the last scan proved. The
// next round assigns its keys without waiting for a scan (at 100,000
// keys a scan takes a few hundred milliseconds), and a scan round follows
// a few milliseconds later to read the members as pg_locks has them: a
// key the dying backend had not released yet is taken then. Safety does
// not depend on the members (keys are taken by try-locks); a member
// taken out wrongly is listed again RenewDeadline after the report (see
// withoutGone).
func (g *Group) memberGone(member string) {
	if member == g.cfg.Identity {
		// This member's previous session, seen gone by its watcher after
		// this one began: this member is not gone, and must never keep
		// itself out of its own members.
		return
	}
	g.gone[member] = time.Now()
	if i := slices.Index(g.st.members, member); i >= 0 {
		g.st.members = slices.Delete(slices.Clone(g.st.members), i, i+1)
	}
	g.soon = true
}

// watchRing runs the crash watch until ctx ends: it follows the member
// targets sends (the ring successor after each round), reconnecting after
// faults no faster than once per RenewInterval.
func (g *Group) watchRing(ctx context.Context, targets <-chan string) {
	r := timing.NewRetry(g.cfg.durations())
	target := ""
	for ctx.Err() == nil {
		began := time.Now()
		err := g.watchSession(ctx, targets, &target)
		if ctx.Err() != nil {
			return
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "42501" || pgErr.Code == "25006") {
			// No TEMP privilege, or a read-only role: every new session
			// would fail the same way, with an ERROR in the server's log.
			g.log.Warn("crash watch off for this process: its session function cannot be created (no TEMP privilege, or a read-only role); a member's death is seen at the next round instead", zap.Error(err))
			return
		}
		attempt, delay := r.Next(time.Since(began), err)
		delay = max(delay, g.cfg.RenewInterval)
		g.log.Debug("crash watch: reconnecting", zap.Int("attempt", attempt), zap.Duration("delay", delay), zap.Error(err))
		if !timing.Sleep(ctx, delay) {
			return
		}
	}
}

// watchSession is one connection's life of the crash watch.
func (g *Group) watchSession(ctx context.Context, targets <-chan string, target *string) error {
	ring, err := g.openRing(ctx)
	if err != nil {
		return err
	}
	defer ring.Close()
	// Stopping cancels a wait in progress (caught in the function, no log
	// line), so that Run returns soon (Ring.Cancel: within 50 ms, or at
	// the wait's own end when that is nearer) rather than after the wait;
	// the cancel request goes out before the session closes.
	stopped := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(stopped)
		ring.Cancel()
	})
	defer func() {
		if !stop() {
			<-stopped
		}
	}()
	for {
		if !nextTarget(ctx, targets, target) {
			return nil
		}
		gone, retargeted, err := g.watchOnce(ctx, ring, targets, *target)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			// The new target, taken from the channel, is watched by the
			// next session: the rounds send a target only when it
			// changes, and the next change may be far off (the bench
			// found a member killed 35 s before anyone saw it: the cancel
			// that retargeted the wait failed it, and the target was
			// lost with the session).
			if retargeted != "" {
				*target = retargeted
			}
			return err
		}
		if retargeted != "" {
			*target = retargeted
		} else if gone {
			g.log.Debug("crash watch: a member is gone", zap.String("member", *target))
			g.reportGone(*target)
			*target = "" // watch it again only once a round named the next target
		}
	}
}

// openRing opens the watch's session.
func (g *Group) openRing(ctx context.Context) (*lockconn.Ring, error) {
	c := g.cfg
	cctx, cancel := context.WithTimeout(ctx, c.LeaseDuration)
	defer cancel()
	conn, err := c.Connect.Connect(cctx)
	if err != nil {
		return nil, err
	}
	sess, err := lockconn.Setup(cctx, conn, lockconn.Settings{Identity: c.appName(), LockTimeout: c.RenewInterval, Lease: c.LeaseDuration, KeepIdle: c.RenewDeadline})
	if err != nil {
		lockconn.Close(conn)
		return nil, err
	}
	ring, err := lockconn.NewRing(cctx, conn, sess, c.Group, c.RenewDeadline)
	if err != nil {
		lockconn.Close(conn)
		return nil, err
	}
	return ring, nil
}

// nextTarget follows the latest target; with none, it waits for one. It
// reports false when ctx ends.
func nextTarget(ctx context.Context, targets <-chan string, target *string) bool {
	for {
		select {
		case t := <-targets:
			*target = t
			continue
		case <-ctx.Done():
			return false
		default:
		}
		if *target != "" {
			return true
		}
		select {
		case t := <-targets:
			*target = t
		case <-ctx.Done():
			return false
		}
	}
}

// watchOnce waits once on target's member lock. A new target (the members
// changed) ends the wait with one cancel request (Ring.Cancel: none to a
// wait about to end by itself), so that the new successor is watched at
// once: it is returned as retargeted. A request the server ignored (it
// came before the wait's statement) leaves the wait to end by itself,
// within its length (under deadlock_timeout).
func (g *Group) watchOnce(ctx context.Context, ring *lockconn.Ring, targets <-chan string, target string) (gone bool, retargeted string, err error) {
	callDone, moved, finished := make(chan struct{}), make(chan string, 1), make(chan struct{})
	go func() {
		defer close(finished)
		select {
		case t := <-targets:
			moved <- t
			ring.Cancel()
		case <-callDone:
		}
	}()
	res, err := ring.Wait(ctx, target, g.cfg.RenewDeadline)
	close(callDone)
	<-finished
	select {
	case retargeted = <-moved:
	default:
	}
	g.mu.Lock()
	g.stats.watchWaits++
	g.mu.Unlock()
	switch {
	case err != nil:
		return false, retargeted, err
	case res == nil:
		return false, retargeted, fmt.Errorf("crash watch: %w", leader.ErrStandby)
	}
	return *res && retargeted == "", retargeted, nil
}
