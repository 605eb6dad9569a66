package group

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/internal/wire/terms"
	"github.com/pgleader/pgleader/leader"
)

// The kinds of round: a light one reads nothing (a hand-over heard, a
// poke); a full one proves the session (the check: its own backend, with
// its token, on a primary), which renews the trust window; a scan round is
// a full one that also scans pg_locks, proving every key by its lock and
// reading the members.
type roundKind int

const (
	lightRound roundKind = iota
	fullRound
	scanRound
)

// round is one round, in three steps: read (a full round's check, and a
// scan round's scan, one round trip; a light round reads nothing), plan (a
// pure function of the state and what was read), apply (the state
// changes, then the exchange of locks, one more round trip when there is
// anything to exchange, and the tenures it begins and ends).
func (g *Group) round(ctx context.Context, w wire, kind roundKind) error {
	sent := time.Now()
	g.mu.Lock()
	leading := g.st.anyTenure()
	if kind == lightRound && !sent.Before(g.st.trustEnd) && leading {
		kind = fullRound // the keys are in doubt: only a full round may go on
	}
	full := kind != lightRound
	// While it leads keys, the round must answer within the trust window
	// (a deadline already past ends the tenures at once: the keys are in
	// doubt; see roundContext for how long the session stays open).
	deadline := g.st.trustEnd
	if !leading {
		deadline = sent.Add(g.cfg.RenewDeadline)
	}
	g.mu.Unlock()
	rctx, cancel := g.roundContext(deadline)
	defer cancel()
	in := input{full: full, scanned: kind == scanRound}
	if full {
		sc, err := g.read(rctx, w, in.scanned)
		if err != nil {
			if rctx.Err() != nil {
				return fmt.Errorf("%w: no answer within the trust window (%v)", leader.ErrRenewDeadline, err)
			}
			return err
		}
		took := time.Since(sent)
		g.mu.Lock()
		if in.scanned {
			names, ranks, pids := splitMembers(sc.Members, sc.PIDs)
			members := g.withoutGone(names, sent)
			in.held, in.members, in.ranks = sc.Held, members, ranks
			g.st.members, g.st.pids, g.st.ranks = members, pids, ranks
			g.noteTiers()
			g.stats.scans++
			g.stats.lastScan, g.scanCost = sent, took
			g.watchNext()
		}
		g.st.trustEnd = sent.Add(g.cfg.RenewDeadline)
		g.stats.rounds++
		g.stats.lastRound, g.stats.lastErr = sent, g.joinErr
	} else {
		g.mu.Lock()
		g.stats.light++
	}
	g.stats.lastStep = time.Now()
	in.now = time.Now()
	a := plan(&g.st, in)
	g.apply(a, in)
	g.mu.Unlock()
	if err := g.exchange(rctx, w, full, a); err != nil {
		if rctx.Err() != nil {
			return fmt.Errorf("%w: no answer within the trust window (%v)", leader.ErrRenewDeadline, err)
		}
		return err
	}
	return nil
}

// read is a full round's read: the member joins first if it could not
// yet, tells the group of members its crash watch saw go, and proves its
// session (on a Direct session with a Sync, no statement); with scan, it
// also proves its keys and reads the members in one scan.
func (g *Group) read(ctx context.Context, w wire, scan bool) (lockconn.Scan, error) {
	g.mu.Lock()
	hook, joined, gone := g.testRound, g.joined, g.goneOut
	g.goneOut = nil
	g.mu.Unlock()
	if hook != nil {
		hook(ctx, w)
	}
	if !joined {
		if err := g.tryJoin(ctx, w); err != nil {
			return lockconn.Scan{}, err
		}
	}
	if len(gone) > 0 {
		// The group hears first, in a round trip of its own, so that the
		// others scan while this member does rather than after its scan
		// (a few hundred milliseconds at 100,000 keys).
		if err := w.Broadcast(ctx, gone, g.marker()); err != nil {
			return lockconn.Scan{}, err
		}
	}
	if !scan && w.Direct() {
		// No statement: a Sync proves a Direct session, and spares the
		// server the walk over every lock the session holds that ends
		// each transaction (docs/groups.md, "Quiet rounds on a direct
		// session").
		return lockconn.Scan{}, w.Ping(ctx)
	}
	return w.Round(ctx, g.marker(), scan)
}

// apply makes plan's state changes (g.mu held): ends the lost tenures,
// drops expired holds, takes a new assignment, and begins the hand-overs.
func (g *Group) apply(a actions, in input) {
	st := &g.st
	for _, k := range a.lost {
		g.end(k, st.keys[k], leader.ErrLockLost)
	}
	for _, k := range a.expired {
		st.keys[k].hold = resignHold{}
		st.dirty = true
	}
	if a.assign != nil {
		if ce := g.log.Check(zap.DebugLevel, "assigned"); ce != nil {
			ce.Write(zap.Strings("members", a.assign.members), zap.Int("mine", len(a.assign.mine)), zap.Bool("full", in.full), zap.Bool("scanned", in.scanned))
		}
		st.owner, st.assigned, st.rekey, st.dirty = a.assign.owner, a.assign.members, false, false
		for k, ks := range st.keys {
			ks.mine, ks.gift = a.assign.mine[k], false
		}
	}
	for _, h := range a.handOver {
		g.handOver(st.keys[h.k], h.reason)
	}
	for _, k := range a.selfHold {
		st.keys[k].hold = resignHold{member: st.me, until: in.now.Add(st.interval)}
	}
	for _, k := range a.overran {
		g.log.Error("OnElected did not return within ReleaseTimeout after its context was cancelled; releasing the key while it still runs",
			zap.Stringer("key", st.keys[k].key))
	}
	if in.full {
		st.pending = nil // in a.broadcast
	}
	if in.scanned {
		st.extra, st.doubt = nil, nil // the scan's held has them
		if len(a.keep) > 0 {
			st.leftover(a.keep...) // still held, decided once OnElected returned
		}
	}
}

// exchange does a round's I/O: the broadcast, then the exchange of locks
// (release, tell, take) in one round trip, then the tenures: those
// released end, those won (and adopted) begin, with their terms.
func (g *Group) exchange(ctx context.Context, w wire, full bool, a actions) error {
	if len(a.broadcast) > 0 {
		if err := w.Broadcast(ctx, a.broadcast, g.marker()); err != nil {
			return err
		}
	}
	if len(a.unlock) == 0 && len(a.want) == 0 && len(a.adopt) == 0 {
		return nil
	}
	if ce := g.log.Check(zap.DebugLevel, "exchange"); ce != nil {
		ce.Write(zap.Int("unlock", len(a.unlock)), zap.Int("want", len(a.want)), zap.Int("adopt", len(a.adopt)))
	}
	x := lockconn.Exchange{Check: !full, Unlock: a.unlock, Want: a.want, Marker: g.marker(),
		// The successors first, alone; the others hear of the resigns (they need
		// them for the same assignment) with the next full round's batch,
		// off the hand-over's path.
		Released: len(a.toSuccessors) == 0 || len(a.unlock) > len(a.toSuccessors)}
	for _, r := range a.toSuccessors {
		if r.To != "" {
			x.Successors = append(x.Successors, r)
		}
	}
	won, unlocked, err := w.Exchange(ctx, x)
	if ce := g.log.Check(zap.DebugLevel, "exchanged"); ce != nil {
		ce.Write(zap.Int("won", len(won)), zap.Int("want", len(a.want)), zap.Error(err))
	}
	if errors.Is(err, lockconn.ErrLockTableFull) {
		err = g.tableFull(err)
		g.inDoubt(a)
	}
	if err == nil || unlocked {
		g.released(a)
	}
	if err != nil {
		return err
	}
	return g.won(ctx, w, append(won, a.adopt...))
}

// inDoubt records what an exchange that met a full lock table left: keys
// won before the error are held without a tenure, found by the next scan
// and adopted then (the adoptions go on). Its unlocks ran: the error
// comes from the try-locks, which follow them in the batch.
func (g *Group) inDoubt(a actions) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.st.doubt == nil {
		g.st.doubt = map[tag]bool{}
	}
	for _, k := range a.want {
		g.st.doubt[k] = true
	}
}

// released ends the tenures whose locks the exchange released: each
// one's OnDemoted, now that its lock is free; and keeps their resigns for
// the group's next full round.
func (g *Group) released(a actions) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.st.pending = append(g.st.pending, a.toSuccessors...)
	for _, k := range a.unlock {
		delete(g.st.extra, k)
	}
	for _, k := range a.released {
		if ks := g.st.keys[k]; ks != nil && ks.phase == phaseHanding {
			g.end(k, ks, ks.tenure.reason)
		}
	}
}

// won begins the tenures of the keys won, after installing their terms
// (with fencing). A term row locked by an old leader's transaction keeps
// the locks for the next full round, which adopts them.
func (g *Group) won(ctx context.Context, w wire, won []tag) error {
	if len(won) == 0 {
		return nil
	}
	g.mu.Lock()
	lapsed := !time.Now().Before(g.st.trustEnd)
	if lapsed {
		// The answer came after the trust window's end: no OnElected
		// begins without trust (the loop below would keep every key
		// too), and with fencing no term is installed for keys that
		// cannot be led now: a transaction, and a term, spent for
		// nothing. The locks are kept, and adopted by a round that
		// renews the window.
		g.st.leftover(won...)
	}
	g.mu.Unlock()
	if lapsed {
		return nil
	}
	termOf := map[tag]int64{}
	if g.cfg.Fencing.Enabled {
		var err error
		if termOf, err = g.bump(ctx, w, won); err != nil {
			return err
		}
		if termOf == nil {
			return nil
		}
	}
	begun := make([]*tenure, 0, len(won))
	g.mu.Lock()
	for _, k := range won {
		ks := g.st.keys[k]
		if ks == nil || !ks.inSet || ks.phase != phaseFree || g.st.stopping {
			g.st.leftover(k) // released next round
			continue
		}
		if !time.Now().Before(g.st.trustEnd) {
			// The terms' answer came late, or beginning the keys before
			// this one took that long (the lapse waits for g.mu): the
			// same as a late win, the lock kept for a round that renews
			// the window.
			g.st.leftover(k)
			continue
		}
		delete(g.st.extra, k)
		begun = append(begun, g.begin(ks, w.PID(), termOf[k]))
	}
	g.mu.Unlock()
	g.launch(begun)
	return nil
}

// bump installs the next term of each key won; nil, nil when a term row is
// busy or the server's lock table is full (the locks are kept, and adopted
// next round).
func (g *Group) bump(ctx context.Context, w wire, won []tag) (map[tag]int64, error) {
	names := make([]string, len(won))
	g.mu.Lock()
	for i, k := range won {
		if ks := g.st.keys[k]; ks != nil {
			names[i] = ks.key.String()
		}
	}
	g.mu.Unlock()
	termOf, err := w.Bump(ctx, won, names)
	switch {
	case lockconn.IsLockTimeout(err):
		g.log.Warn("could not install the next fencing terms yet; trying again next round", zap.Error(err))
	case lockconn.IsLockTableFull(err):
		// Another role filled the server's lock table, which the terms'
		// transaction needs a slot of (its transaction id): the
		// transaction was rolled back and the session is fine. Ending it
		// would let go of every key this member leads, and of a key
		// whose OnElected still drains after a hand-over, while its
		// OnElected still runs. The keys won wait, held, as after a busy
		// term row.
		if ferr := g.tableFull(fmt.Errorf("%w: install terms: %w", lockconn.ErrLockTableFull, err)); ferr != nil {
			return nil, ferr
		}
	default:
		if err != nil {
			return nil, terms.Classify(err, g.cfg.Fencing.Table)
		}
		return termOf, nil
	}
	g.mu.Lock()
	g.st.leftover(won...) // adopted next round
	g.mu.Unlock()
	return nil, nil
}

// tableFull handles a full lock table met by an exchange (or by the
// installation of the terms of the keys it won). A group that
// fits the table (it passed the start's check) met a table another
// session filled: no key is taken this round, the session goes on, and
// the keys it wanted are tried again at a scan round (which adopts those
// won before the error: a try would stack them), due within 5
// RenewIntervals (hintEvery) while any is in doubt; a Warn at most once a
// minute, a count in Status, and LastError say so. A group that can never
// fit ends Run.
func (g *Group) tableFull(cause error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	keys := len(g.st.order)
	err := tableError(g.table, keys, cause)
	if 2*keys > g.table.Capacity() {
		return err
	}
	g.stats.tableFull++
	g.stats.lastErr = err.Error()
	if time.Since(g.tableWarned) > time.Minute {
		g.tableWarned = time.Now()
		g.log.Warn("the server's lock table is full (another session holds most of it): no key is taken until it has room; trying again at every full round", zap.Error(err))
	}
	return nil
}
