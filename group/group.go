package group

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/internal/wire/terms"
	"github.com/pgleader/pgleader/internal/wire/timing"
	"github.com/pgleader/pgleader/leader"
)

// Group runs many elections on one connection per member and spreads them
// over its members; see New.
type Group struct {
	cfg Config
	log *zap.Logger
	// channel and myChannel are the group's NOTIFY channel and this
	// member's own.
	channel, myChannel string
	ran                atomic.Bool
	// wake asks the session loop for a light round now: a poke.
	wake chan struct{}
	wg   sync.WaitGroup // every OnElected and OnDemoted goroutine

	mu sync.Mutex
	st state
	// joined: this session holds the roster lock (another session may
	// hold it exclusively; see join). joinErr says who does.
	joined     bool
	joinErr    string
	joinWarned time.Time
	// hintAt: no message from an unknown session triggers a full round
	// before it.
	hintAt time.Time
	// hintLater: a hint came before hintAt; a scan round runs at hintAt
	// (one for all those that came), so that a genuine joiner is never
	// left for the periodic scan.
	hintLater bool
	// table is the lock table's size as this session read it at its start;
	// tableWarned when a full table was last logged.
	table       lockconn.LockTable
	tableWarned time.Time
	termsTable  string // as this session found it (Leadership.TermsTable)

	// The crash watch (watch.go): the ring successor it watches, members
	// it reported gone that a round still listed, and those to tell the
	// group of with the next full round (from the main session, whose pid
	// the others know).
	ring     chan string
	ringLast string
	gone     map[string]time.Time
	goneOut  []lockconn.GroupMessage
	soon     bool // run a scan round soon: soonWait after the round, 5 ms at least
	soonWait time.Duration
	// fullSoon: the next round is at least a full one, whatever woke it;
	// scanSoon: a scan round; scanCost: how long the last scan round took
	// (see scanEvery).
	fullSoon, scanSoon bool
	scanCost           time.Duration
	// tiers is what the last scan said of the members' ranks (see
	// noteTiers), logged when it changes.
	tiers string

	stats stats
	// open opens the main session (a scripted one in tests); testRound
	// runs before each full round, and testScanEvery, when set, is the
	// least pause between scans (tests only; see export_test.go).
	open          func(ctx context.Context) (wire, error)
	testRound     func(ctx context.Context, w wire)
	testScanEvery time.Duration
}

// New validates cfg and returns a Group. Run it with Run.
//
// A group leads any number of keys on one session per member (a second
// one watches for crashes) and spreads them over its members: each leads
// ⌊K/M⌋ or ⌈K/M⌉ keys. The per-key contract is the Elector's (see the
// package doc).
func New(cfg Config) (*Group, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	set, err := keySet(cfg.Keys)
	if err != nil {
		return nil, err
	}
	g := &Group{cfg: cfg, wake: make(chan struct{}, 1), gone: map[string]time.Time{},
		stats: stats{demoted: map[string]int64{}},
		log:   cfg.Logger.With(zap.String("group", cfg.Group), zap.String("identity", cfg.Identity))}
	g.st = state{me: cfg.Identity, interval: cfg.RenewInterval, release: cfg.ReleaseTimeout, keys: map[tag]*keyState{}}
	g.st.setKeys(set)
	g.channel, g.myChannel = lockconn.GroupChannel(cfg.Group), lockconn.MemberChannel(cfg.Group, cfg.Identity)
	g.open = g.openMember
	return g, nil
}

// keySet checks keys: valid, and no two with the same lock.
func keySet(keys []leader.Key) (map[tag]leader.Key, error) {
	m := make(map[tag]leader.Key, len(keys))
	for i, k := range keys {
		if !k.Valid() {
			return nil, &leader.ConfigError{Field: "Keys", Rule: fmt.Sprintf("key %d is not a valid key", i)}
		}
		t := tagOf(k)
		if _, dup := m[t]; dup {
			return nil, &leader.ConfigError{Field: "Keys", Rule: fmt.Sprintf("key %s appears twice (or two names hash to the same lock)", k)}
		}
		m[t] = k
	}
	return m, nil
}

// SetKeys replaces the key set; keys that leave it are handed over (their
// OnElected is cancelled, then they are released), new ones are taken as
// the assignment gives them to this member.
func (g *Group) SetKeys(keys []leader.Key) error {
	set, err := keySet(keys)
	if err != nil {
		return err
	}
	g.mu.Lock()
	g.st.setKeys(set)
	g.mu.Unlock()
	g.poke()
	return nil
}

func (g *Group) poke() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// Owned returns the keys this member leads now, in lock order (by the
// lock's classid, objid, objsubid, as pg_locks shows them). The group's
// rounds wait only while the keys are collected, not while they are
// sorted.
func (g *Group) Owned() []leader.Key {
	type owned struct {
		k   tag
		key leader.Key
	}
	var out []owned
	g.mu.Lock()
	if !time.Now().After(g.st.trustEnd) {
		// Counting first costs a walk and saves the appends' copies: about
		// 2 ms with the lock held at 33,334 keys, where appending alone
		// took 9 (measured beside BenchmarkOwned).
		out = make([]owned, 0, g.ownedCount())
		for k, ks := range g.st.keys {
			if ks.phase == phaseLeading {
				out = append(out, owned{k, ks.key})
			}
		}
	}
	g.mu.Unlock()
	if len(out) == 0 {
		return nil
	}
	slices.SortFunc(out, func(a, b owned) int { return compareTags(a.k, b.k) })
	keys := make([]leader.Key, len(out))
	for i, o := range out {
		keys[i] = o.key
	}
	return keys
}

// ownedCount is how many keys this member leads, trusted or not (g.mu
// held).
func (g *Group) ownedCount() int {
	n := 0
	for _, ks := range g.st.keys {
		if ks.phase == phaseLeading {
			n++
		}
	}
	return n
}

// compareTags orders lock tags as pg_locks lists them: classid, objid,
// objsubid.
func compareTags(a, b tag) int {
	return cmp.Or(cmp.Compare(a.C, b.C), cmp.Compare(a.O, b.O), cmp.Compare(a.S, b.S))
}

// IsLeader reports whether this member leads key now.
func (g *Group) IsLeader(key leader.Key) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	ks := g.st.keys[tagOf(key)]
	return ks != nil && ks.phase == phaseLeading && time.Now().Before(g.st.trustEnd)
}

// Members returns the group's members as the last full round saw them.
func (g *Group) Members() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.st.members)
}

// Resign hands key over to another member: its OnElected is cancelled,
// the lock is released once it returns, and the group keeps the key away
// from this member for ten renew intervals (the member that ranks it next
// leads it meanwhile, and no other key moves); a member alone in its group
// leads the key again after one interval. It returns once OnDemoted ran,
// or leader.ErrNotLeader when this member does not lead key.
func (g *Group) Resign(ctx context.Context, key leader.Key) error {
	g.mu.Lock()
	ks := g.st.keys[tagOf(key)]
	if ks == nil || ks.phase != phaseLeading {
		g.mu.Unlock()
		return leader.ErrNotLeader
	}
	hold := 10 * g.cfg.RenewInterval
	if len(g.st.members) < 2 {
		// No other member to take it: lead it again after one interval,
		// as an Elector alone does after a resign.
		hold = g.cfg.RenewInterval
	}
	ks.hold = resignHold{member: g.cfg.Identity, until: time.Now().Add(hold)}
	g.st.dirty = true
	t := ks.tenure
	g.handOver(ks, leader.ErrResigned)
	g.mu.Unlock()
	// The release goes out once OnElected has returned: its goroutine
	// pokes the loop then. Poke now only if it already has.
	if t.returned() {
		g.poke()
	}
	select {
	case <-t.demoted:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Run runs the group until ctx ends: it joins, leads its share of the keys,
// hands keys over as members come and go, and reconnects after faults.
// When ctx ends it hands every key over gracefully and returns nil. It
// returns an error for what retrying cannot fix (the elector's Permanent
// errors, and a lock table too small for the group: ErrLockTable).
// Everything else is retried with the Elector's backoff.
func (g *Group) Run(ctx context.Context) error {
	if !g.ran.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer g.wg.Wait()
	r := timing.NewRetry(g.cfg.durations())
	for {
		began := time.Now()
		err := g.session(ctx)
		g.mu.Lock()
		g.stats.connected, g.stats.lastStep = false, time.Now()
		if err != nil {
			g.stats.lastErr = err.Error()
		}
		g.mu.Unlock()
		if ctx.Err() != nil {
			return nil
		}
		if timing.Permanent(err) || errors.Is(err, ErrLockTable) {
			g.log.Error("giving up: retrying cannot fix this", zap.Error(err))
			return err
		}
		attempt, delay := r.Next(time.Since(began), err)
		r.Log(g.log, attempt, delay, err)
		if !timing.Sleep(ctx, delay) {
			return nil
		}
	}
}

// openMember opens the main session: connect, set up, prove no pooler in
// between, check the lock table, prepare, find the terms table, take the
// member lock and listen.
func (g *Group) openMember(ctx context.Context) (wire, error) {
	c := g.cfg
	cctx, cancel := context.WithTimeout(ctx, c.LeaseDuration)
	defer cancel()
	conn, err := c.Connect.Connect(cctx)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	sess, err := lockconn.Setup(cctx, conn, lockconn.Settings{Identity: c.appName(), LockTimeout: c.RenewInterval, Lease: c.LeaseDuration,
		KeepIdle: c.RenewDeadline})
	if err == nil {
		// Before anything is locked: no transaction pooler in between.
		err = lockconn.Prove(cctx, sess, c.Connect.Connect)
	}
	if err != nil {
		lockconn.Close(conn)
		return nil, fmt.Errorf("session setup: %w", err)
	}
	m := lockconn.NewMember(conn, sess, c.Group, c.Identity)
	if err := g.prepareMember(cctx, m); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// prepareMember readies a new session: the lock table's size, the
// prepared statements, the terms table, the member lock, the channels.
func (g *Group) prepareMember(ctx context.Context, m *lockconn.Member) error {
	lt, err := m.LockTable(ctx)
	if err != nil {
		return fmt.Errorf("session setup: %w", err)
	}
	g.mu.Lock()
	g.table = lt
	keys := len(g.st.order)
	g.mu.Unlock()
	if err := tableError(lt, keys, nil); err != nil {
		return err
	}
	if err := m.Prepare(ctx); err != nil {
		return fmt.Errorf("session setup: %w", err)
	}
	if f := g.cfg.Fencing; f.Enabled {
		tbl, err := m.EnsureTerms(ctx, f.Table, terms.EnsureOptions{Create: !f.NoCreate, TrustedOwner: f.TrustedOwner})
		if err != nil {
			return fmt.Errorf("fencing: %w", err)
		}
		g.mu.Lock()
		g.termsTable = tbl.Raw(f.Table)
		g.mu.Unlock()
	}
	if err := g.proclaimMember(ctx, m); err != nil {
		return err
	}
	return g.takeMemberLock(ctx, m)
}

// proclaimMember writes this member's value (Config.Value) for the new
// session, before it takes any key. A table another role owns is an
// error Run gives up on; a write the server refuses is logged, and the
// member goes on without a value until its next session.
func (g *Group) proclaimMember(ctx context.Context, m *lockconn.Member) error {
	c := g.cfg
	if c.Value == nil {
		return nil
	}
	var err error
	// A statement the server refused (a lock wait past lock_timeout while
	// the other members create the table, say) is tried again, a few
	// times, before the member goes on without a value.
	for attempt := 0; attempt < 5; attempt++ {
		var tbl terms.Table
		tbl, err = m.EnsureValues(ctx, c.Values.Table, terms.EnsureOptions{Create: !c.Values.NoCreate, TrustedOwner: c.Values.TrustedOwner})
		if err == nil {
			err = m.ProclaimMember(ctx, terms.ProclaimSQL(tbl.Quoted()), c.Value)
		}
		switch {
		case err == nil:
			return nil
		case errors.Is(err, terms.ErrForeignTable) || errors.Is(err, terms.ErrNoTable) || !lockconn.IsServerError(err):
			return fmt.Errorf("values: %w", err)
		}
		if !timing.Sleep(ctx, time.Duration(50<<attempt)*time.Millisecond) {
			return ctx.Err()
		}
	}
	g.log.Warn("could not write this member's value; its keys show no value until its next session", zap.Error(err))
	return nil
}

// takeMemberLock takes the member lock (one member per identity) and
// listens on the group's channels. Any role can take any advisory lock: a
// member lock held by a session of another role does not stop the join
// (the others' crash watch then cannot watch this member: its death is
// seen at their next round).
func (g *Group) takeMemberLock(ctx context.Context, m *lockconn.Member) error {
	mine, h, err := m.TakeMemberLock(ctx)
	if err != nil {
		return err
	}
	if !mine {
		if h.OwnRole || h.PID == 0 {
			return fmt.Errorf("another session named %q is a member of group %q (%s; identities must be unique in a group, and an old session of this member may linger until its lease ends)", g.cfg.Identity, g.cfg.Group, h)
		}
		g.log.Warn("this member's lock is held by a session of another role; joining without it: the crash watch cannot watch this member, so the others see its death at their next round",
			zap.Uint32("holder_pid", h.PID), zap.String("holder_role", h.Role), zap.String("holder_application_name", h.App))
	}
	return m.Listen(ctx)
}

// tableError is the LockTableError of a group of keys that does not fit,
// or of a full table (cause); nil when the group fits and nothing failed.
func tableError(lt lockconn.LockTable, keys int, cause error) error {
	capacity := lt.Capacity()
	if 2*keys <= capacity && cause == nil {
		return nil
	}
	need := (2*keys + lt.Conns + lt.Prepared - 1) / max(1, lt.Conns+lt.Prepared)
	return &LockTableError{Keys: keys, Capacity: capacity, MaxLocksPerTransaction: max(need, lt.PerTx+1), Err: cause}
}
