package group

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
)

// What ends an idle wait, and so which round follows.
const (
	wakeScan  = iota // the members changed: a scan round
	wakeFull         // a round is due
	wakeLight        // a poke, or a key was released or resigned
)

// idle reads the session until `until`, a poke, or a message on the
// group's channels (a member joined or is gone, or a key was released or
// resigned). When ctx ends it starts the graceful stop: every key is
// handed over, and the rounds go on until none is held.
func (g *Group) idle(ctx context.Context, w wire, until time.Time) (int, error) {
	wctx, cancel := context.WithDeadline(context.Background(), until)
	defer cancel()
	g.mu.Lock()
	stopping := g.st.stopping
	g.mu.Unlock()
	if !stopping {
		stop := context.AfterFunc(ctx, cancel)
		defer stop()
	}
	var poked atomic.Bool
	go func() {
		select {
		case <-g.wake:
			poked.Store(true)
			cancel()
		case <-wctx.Done():
		}
	}()
	for {
		n, err := w.Wait(wctx)
		switch {
		case err == nil:
			if wake, ok := g.heard(n, w.PID()); ok {
				return wake, nil
			}
		case ctx.Err() != nil && !stopping:
			g.stop(ctx.Err())
			return wakeLight, nil
		case wctx.Err() != nil:
			if poked.Load() {
				return wakeLight, nil
			}
			return wakeFull, nil
		default:
			return 0, err
		}
	}
}

// stop begins the graceful stop: every key is handed over with reason.
func (g *Group) stop(reason error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.st.stopping {
		return
	}
	g.st.stopping = true
	for _, ks := range g.st.keys {
		g.handOver(ks, reason)
	}
}

// heard handles a notification; it reports whether a round should run
// now, and which. NOTIFY is not authenticated, but the server stamps the
// sender's backend pid: a message is believed only from a member's main
// session as the last scan read it. A resign on this member's own channel
// is believed from any member (it is told as the key is released); its
// copy on the group's channel only from the member that owns the key, or
// the one its owner's resign hands it to (see state.owns), and not where
// it is old news (see resignHeard). From any other session a join is a
// hint (one scan round at most every hintEvery, which checks pg_locks
// itself); everything else, and anything malformed, is dropped and costs
// nothing.
func (g *Group) heard(n *pgconn.Notification, self uint32) (int, bool) {
	if !g.isMine(n) || n.PID == self {
		return 0, false
	}
	m, err := lockconn.ParseGroup(n.Payload)
	g.mu.Lock()
	defer g.mu.Unlock()
	sender, member := g.st.pids[n.PID]
	switch {
	case err != nil:
	case !member:
		if now := time.Now(); m.Kind == lockconn.GroupJoined && !now.Before(g.hintAt) {
			g.hintAt = now.Add(g.hintEvery())
			return wakeScan, true
		} else if m.Kind == lockconn.GroupJoined {
			g.hintLater = true
		}
	case m.Kind == lockconn.GroupJoined:
		return wakeScan, true
	case m.Kind == lockconn.GroupReleased:
		return wakeLight, true
	case m.Kind == lockconn.GroupGone:
		g.memberGone(m.Member)
		return wakeFull, true
	case m.Kind == lockconn.GroupResigned && m.Member == sender && n.Channel == g.myChannel && m.To == g.cfg.Identity:
		// Told to this member alone, as the member released the key: never
		// old news (the server delivers notifications in commit order), so
		// believed whatever this member's last assignment says of the key.
		return g.resignHeard(m, sender, true)
	case m.Kind == lockconn.GroupResigned && m.Member == sender && n.Channel == g.channel && g.st.owns(m.Key, sender):
		return g.resignHeard(m, sender, false)
	}
	g.stats.dropped++
	if ce := g.log.Check(zap.DebugLevel, "group message dropped"); ce != nil {
		ce.Write(zap.Uint32("sender_pid", n.PID), zap.String("sender", sender), zap.String("payload", n.Payload))
	}
	return 0, false
}

// resignHeard takes in a member's resign of a key it owned (g.mu held):
// the key is kept from it for a while, and given to this member at once
// when it is the successor; only the successor need act now.
//
// A resign reaches its successor twice: on the successor's own channel at
// once, and on the group's channel with the resigner's next full round
// (for the others' assignments). By then the key may have moved on (the
// successor led it and resigned it back), so the group's copy is old news
// where this member knows newer: it never gives the key (the direct
// message did), and it is dropped where this member already holds a
// resign of the key or leads it (nobody can have resigned a key since
// this member took its lock). Believing it would hand the key back to the
// member that just resigned it, and keep the successor off it for the
// whole hold (found by the benchmark: resigns of one key back and forth
// every 200 ms waited out the 10 s hold).
func (g *Group) resignHeard(m lockconn.GroupMessage, sender string, direct bool) (int, bool) {
	ks := g.st.keys[m.Key]
	if ks == nil {
		g.stats.dropped++ // owns said yes, so this cannot be; drop it all the same
		return 0, false
	}
	if !direct && (ks.phase == phaseLeading || ks.hold.set() && m.To == g.cfg.Identity) {
		g.log.Debug("a resign's group copy is old news here", zap.String("from", sender), zap.Stringer("key", ks.key), zap.String("to", m.To))
		return 0, false
	}
	ks.hold = resignHold{member: sender, until: time.Now().Add(10 * g.cfg.RenewInterval)}
	g.st.dirty = true
	successor := direct && m.To == g.cfg.Identity
	if successor {
		ks.gift = true
	}
	return wakeLight, successor
}

// isMine reports whether n came on the group's channels.
func (g *Group) isMine(n *pgconn.Notification) bool {
	return n.Channel == g.channel || n.Channel == g.myChannel
}

// hintEvery is how often a message from a session that is not a known
// member may trigger a scan round (g.mu held): four times per
// RenewInterval while scans are cheap; when they are not, no more than
// 0.5% of this member's time in scans (see scanEvery), but at least once
// per 5 RenewIntervals, so that members joining one after another in a
// rolling deploy are each seen within 5 s at the default timings however
// many keys the group has. A flood of forged joins then costs each member
// one scan per 5 RenewIntervals at most.
func (g *Group) hintEvery() time.Duration {
	return max(g.cfg.RenewInterval/4, min(scanShare*g.scanCost, 5*g.cfg.RenewInterval), time.Millisecond)
}
