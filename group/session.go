package group

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
)

// session is one connection's life: open, join, start the crash watch,
// then rounds until the member has left or the session fails.
func (g *Group) session(ctx context.Context) (err error) {
	w, err := g.open(ctx)
	if err != nil {
		return err
	}
	defer func() {
		// A fault: every key is gone with the session.
		g.demoteAll(err)
		w.Close()
	}()
	jctx, cancel := context.WithTimeout(ctx, g.cfg.LeaseDuration)
	g.mu.Lock()
	g.joined = false
	g.mu.Unlock()
	err = g.tryJoin(jctx, w)
	cancel()
	if err != nil {
		return err
	}
	g.mu.Lock()
	g.stats.connected = true
	g.mu.Unlock()
	if !g.cfg.SingleConnection {
		stop := g.startWatch(ctx)
		defer stop()
	}
	return g.loop(ctx, w)
}

// loop runs the rounds. A full round proves the session; it is due
// RenewInterval after the last one began, however many light rounds ran
// between (the trust window runs from the last full round). A scan round
// (a full round that also scans pg_locks, proving every key by its lock
// and reading the members) runs first in each session, when the members
// changed (a join, a leave, a member gone), and otherwise every
// scanEvery. A light round (a poke, a release heard) only releases what is
// handed over and takes what is free and this member's, with the members
// the last scan read: a hand-over then costs two round trips on each side,
// not two scans.
func (g *Group) loop(ctx context.Context, w wire) error {
	var began, scanned time.Time
	wake := wakeScan
	for {
		g.mu.Lock()
		now := time.Now()
		kind := lightRound
		hinted := g.hintLater && !now.Before(g.hintAt)
		if hinted {
			g.hintLater, g.hintAt = false, now.Add(g.hintEvery())
		}
		if wake != wakeLight || now.Sub(began) >= g.cfg.RenewInterval || g.scanSoon || g.fullSoon || hinted {
			kind = fullRound
		}
		// Keys a failed exchange may have won are taken only by a scan
		// round, which says whether the session holds them (a try would
		// stack them): their scan comes at the hints' pace, not after the
		// periodic scan's pause, which one slow scan can make long.
		doubt := len(g.st.doubt) > 0 && now.Sub(scanned) >= g.hintEvery()
		if wake == wakeScan || g.scanSoon || hinted || kind == fullRound && (doubt || now.Sub(scanned) >= g.scanEvery()) {
			kind = scanRound
		}
		g.scanSoon, g.fullSoon = false, false
		g.mu.Unlock()
		if kind != lightRound {
			began = now
		}
		if kind == scanRound {
			scanned = now
		}
		if err := g.round(ctx, w, kind); err != nil {
			return err
		}
		g.mu.Lock()
		done := g.st.stopping && !g.st.anyTenure() && !g.st.anyKept()
		next := began.Add(g.cfg.RenewInterval)
		if g.soon {
			// A member the crash watch reported gone was still listed:
			// its backend was still releasing its locks.
			next, g.soon, g.scanSoon = time.Now().Add(max(5*time.Millisecond, g.soonWait)), false, true
			g.soonWait = 0
		}
		if g.hintLater && g.hintAt.Before(next) {
			next = g.hintAt // the hints held back
		}
		g.mu.Unlock()
		if done {
			g.leave(w)
			return nil
		}
		var err error
		if wake, err = g.idle(ctx, w, next); err != nil {
			return err
		}
	}
}

// scanEvery is how often a scan round is due when nothing changed (g.mu
// held). A scan reads pg_locks, which copies the server's whole lock table
// (a large group's keys are most of it): its cost grows with the keys. It
// runs every RenewInterval while it takes under 0.5% of that (5 ms at the
// default 1s: a few thousand locks on the server), and otherwise as often
// as spends 0.5% of this member's time on scans: every 200 times the last
// scan's duration (at 100,000 keys, every 20 s or so). The session, proven
// at every full round, proves the keys between (docs/groups.md, "What a
// round proves"); the scan reads the members, and proves each key again.
func (g *Group) scanEvery() time.Duration {
	return max(g.cfg.RenewInterval, scanShare*g.scanCost, g.testScanEvery)
}

// scanShare paces the scans: a member spends at most 1/scanShare of its
// time (0.5%) on them, periodic or hinted.
const scanShare = 200

// leave frees the member and roster locks, then tells the group (the
// NOTIFY goes out at commit, after the unlocks), so that the others take
// this member's keys' new shares at once rather than at their next full
// round.
func (g *Group) leave(w wire) {
	lctx, cancel := context.WithTimeout(context.Background(), g.cfg.RenewDeadline)
	defer cancel()
	if err := w.Leave(lctx); err != nil {
		g.log.Debug("leaving: could not tell the group", zap.Error(err))
	}
}

// tryJoin takes the roster lock, or says who holds it exclusively (a Warn
// and Status().LastError, at most once a minute; the next full round tries
// again).
func (g *Group) tryJoin(ctx context.Context, w wire) error {
	ok, err := w.Join(ctx)
	if err != nil {
		return err
	}
	g.mu.Lock()
	g.joined = ok
	due := !ok && time.Now().After(g.joinWarned.Add(time.Minute))
	if ok {
		g.joinErr = ""
	}
	g.mu.Unlock()
	if ok {
		g.log.Info("joined")
		return nil
	}
	if !due {
		return nil
	}
	h, err := w.RosterHolder(ctx)
	if err != nil {
		return err
	}
	msg := fmt.Sprintf("cannot join group %q: its roster lock (%d, %d) is held exclusively by %s; this member leads nothing until it is freed",
		g.cfg.Group, uint32(lockconn.Space), uint32(lockconn.GroupRoster(g.cfg.Group)), h)
	g.log.Warn(msg, zap.Uint32("holder_pid", h.PID), zap.String("holder_role", h.Role), zap.String("holder_application_name", h.App))
	g.mu.Lock()
	g.joinErr, g.joinWarned, g.stats.lastErr = msg, time.Now(), msg
	g.mu.Unlock()
	return nil
}

// marker is the statement that ends every batch (lockconn.GroupMarker).
func (g *Group) marker() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return lockconn.GroupMarker(g.cfg.Group, len(g.st.order))
}
