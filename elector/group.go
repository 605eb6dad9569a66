package elector

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/pgleader/pgleader/internal/lockconn"
	"github.com/pgleader/pgleader/internal/terms"
	"github.com/pgleader/pgleader/internal/timing"
	"github.com/pgleader/pgleader/leader"
)

// A Group runs many elections on one connection and spreads them over its
// members. Every member of a group (processes that run a Group with the
// same Group name against the same database) holds the group's roster lock
// in share mode, so pg_locks lists the members; each round, one round trip
// per RenewInterval, reads that list and this session's own locks (one
// scan of pg_locks), which proves every key this member leads and renews
// them all at once. Every member computes the same assignment of keys to
// members from the same list (rendezvous hashing with bounded loads: each
// member gets ⌊K/M⌋ or ⌈K/M⌉ keys), takes the free keys assigned to it
// with pg_try_advisory_lock (never a wait, so no lock wait and no deadlock
// detector), and hands over the keys assigned to others: their OnElected
// is cancelled, the lock stays held and renewed until it returns, then it
// is released and the group is told (a NOTIFY on the group's channel), so
// that the new owner takes it at once.
//
// The per-key contract is the Elector's: OnElected's context is cancelled
// before OnDemoted, exactly one OnDemoted per OnElected, a graceful
// hand-over keeps the lock until OnElected returns, and a silent member
// (paused, partitioned) stops trusting its keys RenewDeadline after its
// last successful round, before the server-side lease (LeaseDuration)
// frees them for anyone else: the same ordering argument as the
// Elector's, since one round renews every key.

// GroupConfig configures a Group. Zero durations take the Elector's
// defaults.
type GroupConfig struct {
	// Connect opens the group's one dedicated connection.
	Connect Connector
	// Group names the group: members with the same name on the same
	// database share its keys. At most 200 bytes.
	Group string
	// Keys are the elections. Every member should have the same set; see
	// docs/groups.md for what happens while they differ.
	// Duplicates are an error; an empty set is allowed (the member joins
	// and leads nothing until SetKeys).
	Keys []leader.Key
	// Identity names this member; it becomes the connection's
	// application_name and must be unique in the group. Default
	// hostname-pid.
	Identity string
	// Callbacks run per key: OnElected in a goroutine of its own, with that
	// key's Leadership; OnDemoted once after each OnElected returned (or
	// ReleaseTimeout passed), on another goroutine. A key is not led again
	// by this member before its OnDemoted has run. OnNewLeader is not used.
	Callbacks Callbacks
	// Logger receives structured logs; nil means none.
	Logger *zap.Logger

	RenewInterval, RenewDeadline, LeaseDuration, ReleaseTimeout, ReconnectMaxDelay time.Duration

	// Fencing installs a term per key at each of its elections (no
	// history table for groups yet).
	Fencing Fencing

	// SingleConnection turns the crash watch off: the group then uses one
	// connection per member instead of two, and a member that dies is
	// noticed at the survivors' next round (up to RenewInterval later)
	// instead of at once. See docs/groups.md.
	SingleConnection bool
}

// ErrLockTable is returned (wrapped) by Group.Run when the server's shared
// lock table can never hold the group (a check at every session's start):
// see LockTableError. A table that fits the group but that another
// session has filled (SQLSTATE 53200 while taking keys) is no error:
// the member takes no key until the table has room, keeps what it leads,
// and says so (GroupStatus.LockTableFull and LastError, a Warn at most
// once a minute).
var ErrLockTable = errors.New("pgleader: the server's lock table is too small for this group")

// LockTableError says how big the server's lock table is and what it needs.
// PostgreSQL's shared lock table holds about max_locks_per_transaction ×
// (max_connections + max_prepared_transactions) locks for the whole server;
// a group may use at most half of it, so that the application keeps room.
type LockTableError struct {
	Keys     int // the group's keys
	Capacity int // the server's lock table
	// MaxLocksPerTransaction is the setting that would fit the group,
	// with the server's max_connections and max_prepared_transactions.
	MaxLocksPerTransaction int
	Err                    error // the server's error (SQLSTATE 53200), when it came to that
}

func (e *LockTableError) Error() string {
	s := fmt.Sprintf("%v: %d keys need room for %d locks, and the server's lock table holds about %d (max_locks_per_transaction × (max_connections + max_prepared_transactions)); set max_locks_per_transaction to at least %d (a restart), or split the keys",
		ErrLockTable, e.Keys, 2*e.Keys, e.Capacity, e.MaxLocksPerTransaction)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *LockTableError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrLockTable, e.Err}
	}
	return []error{ErrLockTable}
}

// Group runs many elections on one connection; see NewGroup.
type Group struct {
	cfg     GroupConfig
	log     *zap.Logger
	roster  int32
	channel string
	// myChannel is this member's own channel (see heirChannel).
	myChannel string
	ran       atomic.Bool
	wake      chan struct{}

	wg sync.WaitGroup // every OnElected and OnDemoted goroutine

	mu    sync.Mutex
	keys  map[tagKey]leader.Key
	order []tagKey       // keys in assignment order (see assign)
	index map[tagKey]int // a key's place in order
	// The last assignment, kept while its inputs (keys, members, holds)
	// stay the same: owner[i] is the index in assigned of order[i]'s member.
	owner    []int
	assigned []string
	mine     map[tagKey]bool // this member's keys in it
	rekey    bool            // the keys changed: assign again now
	dirty    bool            // the holds changed: assign again at the next full round
	gifts    map[tagKey]bool // keys resigned to this member, taken before that
	owned    map[tagKey]*groupTerm
	ending   map[tagKey]*groupTerm // demoted, OnDemoted still to come: not taken again until then
	members  []string
	// pids are the members' main sessions as the last full round read
	// them (a member is a session of this member's role holding the
	// roster lock): a group message is believed only from one of them.
	pids map[uint32]string
	// joined: this session holds the roster lock (another session may
	// hold it exclusively; see join). hintAt: no message from an unknown
	// session triggers a full round before it.
	joined     bool
	joinErr    string
	joinWarned time.Time
	hintAt     time.Time
	trustEnd   time.Time             // IsLeader is false past it
	holds      map[tagKey]resignHold // keys resigned by a member: not assigned to it for a while
	stopping   bool
	// table is the lock table's size as this session read it at its start;
	// tableWarned when a full table was last logged.
	table       lockTable
	tableWarned time.Time
	// termSQL installs terms in termsTable, as this session found it.
	termSQL, termsTable string

	// The crash watch (groupwatch.go): the ring successor it watches, and
	// members it reported gone that a round still listed.
	ring     chan string
	ringLast string
	gone     map[string]time.Time
	soon     bool // run the next round within a few milliseconds
	// pending are resigns told to their heirs, for the group with the
	// next full round; goneOut the members this member's crash watch saw
	// go, for the group with the next full round (sent from this session,
	// whose pid the others know, not from the watch's).
	pending, goneOut []lockconn.GroupMessage
	fullSoon         bool // the next round is full, whatever woke it
	// markerSQL is the marker prepared on the current session (the
	// session loop's alone).
	markerSQL string

	stats groupStats
	// testRound runs before each full round (tests only; see export_test.go).
	testRound func(ctx context.Context, conn *pgx.Conn)
}

// tagKey is a key as pg_locks shows it.
type tagKey struct {
	c, o uint32
	s    int16
}

func tagOf(k leader.Key) tagKey {
	c, o, s := k.LockTag()
	return tagKey{c, o, s}
}

// groupTerm is one key's tenure in this member.
type groupTerm struct {
	l         leader.Leadership
	cancel    context.CancelCauseFunc
	done      chan struct{} // OnElected returned
	releasing bool          // the lock is kept until done, then released
	reason    error
	releaseAt time.Time     // past it, the lock is released even if OnElected still runs
	demoted   chan struct{} // closed after OnDemoted
}

// resignHold keeps a resigned key away from the member that resigned it.
type resignHold struct {
	member string
	until  time.Time
}

// NewGroup validates cfg and returns a Group. Run it with Run.
func NewGroup(cfg GroupConfig) (*Group, error) {
	ec := Config{Connect: cfg.Connect, Key: leader.KeyFromName("group"), Identity: cfg.Identity, Callbacks: cfg.Callbacks, Logger: cfg.Logger,
		RenewInterval: cfg.RenewInterval, RenewDeadline: cfg.RenewDeadline, LeaseDuration: cfg.LeaseDuration,
		ReleaseTimeout: cfg.ReleaseTimeout, ReconnectMaxDelay: cfg.ReconnectMaxDelay, Fencing: cfg.Fencing}
	ec.setDefaults()
	if err := ec.validate(); err != nil {
		return nil, err
	}
	cfg.Identity, cfg.Logger, cfg.Fencing = ec.Identity, ec.Logger, ec.Fencing
	cfg.RenewInterval, cfg.RenewDeadline, cfg.LeaseDuration, cfg.ReleaseTimeout, cfg.ReconnectMaxDelay =
		ec.RenewInterval, ec.RenewDeadline, ec.LeaseDuration, ec.ReleaseTimeout, ec.ReconnectMaxDelay
	if err := timing.Printable(cfg.Group, 200); err != nil {
		return nil, &ConfigError{Field: "Group", Rule: err.Error()}
	}
	g := &Group{cfg: cfg, wake: make(chan struct{}, 1), owned: map[tagKey]*groupTerm{}, ending: map[tagKey]*groupTerm{}, holds: map[tagKey]resignHold{}, gone: map[string]time.Time{}, gifts: map[tagKey]bool{},
		stats: groupStats{demoted: map[string]int64{}}}
	if err := g.setKeys(cfg.Keys); err != nil {
		return nil, err
	}
	g.roster = rosterObj(cfg.Group)
	g.channel = fmt.Sprintf("pgleader.group.%d", uint32(g.roster))
	g.myChannel = g.heirChannel(cfg.Identity)
	g.log = cfg.Logger.With(zap.String("group", cfg.Group), zap.String("identity", cfg.Identity))
	return g, nil
}

func (g *Group) setKeys(keys []leader.Key) error {
	m := make(map[tagKey]leader.Key, len(keys))
	for i, k := range keys {
		if !k.Valid() {
			return &ConfigError{Field: "Keys", Rule: fmt.Sprintf("key %d is not a valid key", i)}
		}
		t := tagOf(k)
		if _, dup := m[t]; dup {
			return &ConfigError{Field: "Keys", Rule: fmt.Sprintf("key %s appears twice (or two names hash to the same lock)", k)}
		}
		m[t] = k
	}
	order := keyOrder(m)
	index := make(map[tagKey]int, len(order))
	for i, k := range order {
		index[k] = i
	}
	g.mu.Lock()
	g.keys, g.order, g.index, g.rekey = m, order, index, true
	g.mu.Unlock()
	return nil
}

// SetKeys replaces the key set; keys that leave it are handed over (their
// OnElected is cancelled, then they are released), new ones are taken as
// the assignment gives them to this member.
func (g *Group) SetKeys(keys []leader.Key) error {
	if err := g.setKeys(keys); err != nil {
		return err
	}
	g.poke()
	return nil
}

func (g *Group) poke() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// Owned returns the keys this member leads now.
func (g *Group) Owned() []leader.Key {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []leader.Key
	if time.Now().After(g.trustEnd) {
		return out
	}
	for _, t := range g.owned {
		if !t.releasing {
			out = append(out, t.l.Key)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// IsLeader reports whether this member leads key now.
func (g *Group) IsLeader(key leader.Key) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	t := g.owned[tagOf(key)]
	return t != nil && !t.releasing && time.Now().Before(g.trustEnd)
}

// Members returns the group's members as the last round saw them.
func (g *Group) Members() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.members)
}

// Resign hands key over to another member: its OnElected is cancelled,
// the lock is released once it returns, and the group keeps the key away
// from this member for ten renew intervals (the member that ranks it next
// leads it meanwhile, and no other key moves); a member alone in its group
// leads the key again after one interval. It returns once OnDemoted ran,
// or leader.ErrNotLeader when this member does not lead key.
func (g *Group) Resign(ctx context.Context, key leader.Key) error {
	g.mu.Lock()
	t := g.owned[tagOf(key)]
	if t == nil || t.releasing {
		g.mu.Unlock()
		return leader.ErrNotLeader
	}
	hold := 10 * g.cfg.RenewInterval
	if len(g.members) < 2 {
		// No other member to take it: lead it again after one interval,
		// as an Elector alone does after a resign.
		hold = g.cfg.RenewInterval
	}
	g.holds[tagOf(key)] = resignHold{member: g.cfg.Identity, until: time.Now().Add(hold)}
	g.dirty = true
	g.release(t, leader.ErrResigned)
	g.mu.Unlock()
	// The release goes out once OnElected has returned: its goroutine
	// pokes the loop then. Poke now only if it already has.
	select {
	case <-t.done:
		g.poke()
	default:
	}
	select {
	case <-t.demoted:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// release begins a graceful hand-over of t (g.mu held).
func (g *Group) release(t *groupTerm, reason error) {
	if t.releasing {
		return
	}
	t.releasing, t.reason, t.releaseAt = true, reason, time.Now().Add(g.cfg.ReleaseTimeout)
	t.cancel(reason)
	g.log.Debug("handing over", zap.Stringer("key", t.l.Key), zap.NamedError("reason", reason))
}

// Run runs the group until ctx ends: it joins, leads its share of the keys,
// hands keys over as members come and go, and reconnects after faults.
// When ctx ends it hands every key over gracefully and returns nil. It
// returns an error for what retrying cannot fix: Permanent errors, and a
// lock table too small for the group (ErrLockTable). Everything else is
// retried with the Elector's backoff (see Elector.Run).
func (g *Group) Run(ctx context.Context) error {
	if !g.ran.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer g.wg.Wait()
	r := timing.NewRetry(timing.Durations{RenewInterval: g.cfg.RenewInterval, LeaseDuration: g.cfg.LeaseDuration, ReconnectMaxDelay: g.cfg.ReconnectMaxDelay})
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
		if Permanent(err) || errors.Is(err, ErrLockTable) {
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

// session is one connection's life.
func (g *Group) session(ctx context.Context) (err error) {
	c := g.cfg
	cctx, cancel := context.WithTimeout(ctx, c.LeaseDuration)
	conn, err := c.Connect.Connect(cctx)
	cancel()
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer func() {
		// A fault: every key is gone with the session.
		g.demoteAll(err)
		lockconn.Close(conn)
	}()
	sctx, cancel := context.WithTimeout(ctx, c.LeaseDuration)
	defer cancel()
	sess, err := lockconn.Setup(sctx, conn, lockconn.Settings{Identity: c.Identity, LockTimeout: c.RenewInterval, Lease: c.LeaseDuration,
		KeepIdle: c.RenewDeadline, SyncCommit: true})
	if err != nil {
		return fmt.Errorf("session setup: %w", err)
	}
	// Before anything is locked: no transaction pooler in between.
	if err := lockconn.Prove(sctx, sess, c.Connect.Connect); err != nil {
		return fmt.Errorf("session setup: %w", err)
	}
	if err := g.checkCapacity(sctx, conn); err != nil {
		return err
	}
	if err := g.prepare(sctx, conn); err != nil {
		return fmt.Errorf("session setup: %w", err)
	}
	g.markerSQL = ""
	if c.Fencing.Enabled {
		tbl, err := terms.Ensure(sctx, conn, c.Fencing.Table, terms.EnsureOptions{Create: !c.Fencing.NoCreate,
			Schemas: sess.Schemas, TrustedOwner: c.Fencing.TrustedOwner})
		if err != nil {
			return fmt.Errorf("fencing: %w", err)
		}
		g.mu.Lock()
		g.termSQL, g.termsTable = groupBumpSQL(tbl.Quoted()), tbl.Raw(c.Fencing.Table)
		g.mu.Unlock()
	}
	if err := g.join(sctx, conn); err != nil {
		return err
	}
	g.mu.Lock()
	g.stats.connected = true
	g.mu.Unlock()
	if !c.SingleConnection {
		wctx, stop := context.WithCancel(ctx)
		ring := make(chan string, 1)
		g.mu.Lock()
		g.ring, g.ringLast = ring, ""
		g.mu.Unlock()
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			g.watchRing(wctx, ring)
		}()
		defer stop()
	}
	// A full round proves every key and reads the members; it is due
	// RenewInterval after the last one began, however many light rounds
	// ran between (the trust window runs from the last full round). A
	// light round (wake == wakeLight) only releases what is handed over and
	// takes what is free and this member's, with the members the last
	// full round read: a hand-over then costs two round trips on each
	// side, not two scans of pg_locks.
	var began time.Time
	wake := wakeFull
	for {
		g.mu.Lock()
		full := wake == wakeFull || time.Since(began) >= c.RenewInterval || g.fullSoon
		g.fullSoon = false
		g.mu.Unlock()
		if full {
			began = time.Now()
		}
		if err := g.round(ctx, conn, sess, full); err != nil {
			return err
		}
		g.mu.Lock()
		done := g.stopping && len(g.owned) == 0
		g.mu.Unlock()
		if done {
			// Leave: free the member and roster locks, then tell the group
			// (the NOTIFY goes out at commit, after the unlocks), so that
			// the others take this member's keys' new shares at once
			// rather than at their next full round.
			lctx, cancel := context.WithTimeout(context.Background(), c.RenewDeadline)
			_, err := conn.Exec(lctx, `SELECT pg_advisory_unlock_all(), pg_notify($1, $2)`, g.channel,
				lockconn.EncodeGroup(lockconn.GroupMessage{Kind: lockconn.GroupGone, Member: c.Identity}))
			cancel()
			if err != nil {
				g.log.Debug("leaving: could not tell the group", zap.Error(err))
			}
			return nil
		}
		next := began.Add(c.RenewInterval)
		g.mu.Lock()
		if g.soon {
			// A member the crash watch reported gone was still listed:
			// its backend was still releasing its locks.
			next, g.soon = time.Now().Add(5*time.Millisecond), false
		}
		g.mu.Unlock()
		if wake, err = g.idle(ctx, conn, sess.PID, next); err != nil {
			return err
		}
	}
}

// join takes the member lock (one member per identity), listens on the
// group's channels, takes the roster lock, which makes this session a
// member, and tells the group. Any role can take any advisory lock: a
// member lock held by a session of another role does not stop the join
// (this member then goes unwatched by the others' crash watch: its death
// is seen at their next round); a roster lock held exclusively does, until
// it is freed (tryJoin tries again at every full round, and says who
// holds it).
func (g *Group) join(ctx context.Context, conn *pgx.Conn) error {
	c := g.cfg
	var mine bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, lockconn.HeirClass, memberLock(c.Group, c.Identity)).Scan(&mine); err != nil {
		return err
	}
	if !mine {
		h, err := exclusiveHolder(ctx, conn, memberLock(c.Group, c.Identity))
		if err != nil {
			return err
		}
		if h.ownRole || h.pid == 0 {
			return fmt.Errorf("another session named %q is a member of group %q (%s; identities must be unique in a group, and an old session of this member may linger until its lease ends)", c.Identity, c.Group, h)
		}
		g.log.Warn("this member's lock is held by a session of another role; joining without it: the crash watch cannot watch this member, so the others see its death at their next round",
			zap.Uint32("holder_pid", h.pid), zap.String("holder_role", h.role), zap.String("holder_application_name", h.app))
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{g.channel}.Sanitize()+"; LISTEN "+pgx.Identifier{g.myChannel}.Sanitize(),
		pgx.QueryExecModeSimpleProtocol); err != nil {
		return err
	}
	g.mu.Lock()
	g.joined = false
	g.mu.Unlock()
	return g.tryJoin(ctx, conn)
}

// joinSQL takes the roster lock in share mode and, only when it did, tells
// the group (the NOTIFY is an InitPlan in the CASE's THEN branch, which
// PostgreSQL runs only when that branch is taken).
const joinSQL = `SELECT CASE WHEN pg_try_advisory_lock_shared($1, $2) THEN (SELECT true FROM pg_notify($3, $4)) ELSE false END`

// tryJoin takes the roster lock, or says who holds it exclusively (a Warn
// and Status().LastError, at most once a minute).
func (g *Group) tryJoin(ctx context.Context, conn *pgx.Conn) error {
	var ok bool
	if err := conn.QueryRow(ctx, joinSQL, lockconn.HeirClass, g.roster, g.channel,
		lockconn.EncodeGroup(lockconn.GroupMessage{Kind: lockconn.GroupJoined})).Scan(&ok); err != nil {
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
	h, err := exclusiveHolder(ctx, conn, g.roster)
	if err != nil {
		return err
	}
	msg := fmt.Sprintf("cannot join group %q: its roster lock (%d, %d) is held exclusively by %s; this member leads nothing until it is freed",
		g.cfg.Group, uint32(lockconn.HeirClass), uint32(g.roster), h)
	g.log.Warn(msg, zap.Uint32("holder_pid", h.pid), zap.String("holder_role", h.role), zap.String("holder_application_name", h.app))
	g.mu.Lock()
	g.joinErr, g.joinWarned, g.stats.lastErr = msg, time.Now(), msg
	g.mu.Unlock()
	return nil
}

// holder is a session that holds a lock of pgleader's space.
type holder struct {
	pid       uint32
	role, app string
	ownRole   bool // the session's role is this session's
}

func (h holder) String() string {
	if h.pid == 0 {
		return "a session no longer there"
	}
	return fmt.Sprintf("pid %d (role %q, application_name %q)", h.pid, h.role, h.app)
}

// exclusiveHolder looks up who holds the lock (HeirClass, obj)
// exclusively: one read of pg_locks, made only when a try failed.
func exclusiveHolder(ctx context.Context, conn *pgx.Conn, obj int32) (holder, error) {
	var h holder
	var pid int32
	err := conn.QueryRow(ctx, `SELECT l.pid, coalesce(pg_get_userbyid(a.usesysid)::text, ''), coalesce(a.application_name, ''),
  coalesce(a.usesysid = (SELECT usesysid FROM pg_stat_get_activity(pg_backend_pid())), false)
FROM pg_locks l LEFT JOIN pg_stat_get_activity(NULL) a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.classid = $1::oid AND l.objid = $2::oid AND l.objsubid = 2 AND l.granted
  AND l.mode = 'ExclusiveLock' AND l.pid <> pg_backend_pid() LIMIT 1`, uint32(lockconn.HeirClass), uint32(obj)).Scan(&pid, &h.role, &h.app, &h.ownRole)
	if errors.Is(err, pgx.ErrNoRows) {
		return holder{}, nil
	}
	h.pid = uint32(pid)
	return h, err
}

// What ends an idle wait, and so which round follows.
const (
	wakeFull  = iota // the round is due, or the members changed
	wakeLight        // a poke, or a key was released or resigned
)

// idle reads the session until `until`, a poke, or a notification on the
// group's channel (a member joined or is gone, or a key was released or
// resigned).
func (g *Group) idle(ctx context.Context, conn *pgx.Conn, self uint32, until time.Time) (int, error) {
	wctx, cancel := context.WithDeadline(context.Background(), until)
	defer cancel()
	g.mu.Lock()
	stopping := g.stopping
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
		n, err := conn.WaitForNotification(wctx)
		switch {
		case err == nil:
			if wake, ok := g.heard(n, self); ok {
				return wake, nil
			}
		case ctx.Err() != nil && !stopping:
			g.mu.Lock()
			if !g.stopping {
				g.stopping = true
				for _, t := range g.owned {
					g.release(t, ctx.Err())
				}
			}
			g.mu.Unlock()
			return wakeLight, nil
		case wctx.Err() != nil:
			if poked.Load() {
				return wakeLight, nil
			}
			return wakeFull, nil
		default:
			return 0, fmt.Errorf("%w: %w", leader.ErrConnectionLost, err)
		}
	}
}

// heard handles a notification; it reports whether a round should run
// now, and which. NOTIFY is not authenticated, but the server stamps the
// sender's backend pid: a message is believed only from a member's main
// session as the last full round read it (and a resign only from the
// member that owns the key). From any other session a join is a hint
// (one full round at most every hintEvery, which checks pg_locks itself);
// everything else, and anything malformed, is dropped and costs nothing.
func (g *Group) heard(n *pgconn.Notification, self uint32) (int, bool) {
	if n.Channel != g.channel && n.Channel != g.myChannel || n.PID == self {
		return 0, false
	}
	m, err := lockconn.ParseGroup(n.Payload)
	g.mu.Lock()
	defer g.mu.Unlock()
	sender, member := g.pids[n.PID]
	switch {
	case err != nil:
	case !member:
		if now := time.Now(); m.Kind == lockconn.GroupJoined && !now.Before(g.hintAt) {
			g.hintAt = now.Add(g.hintEvery())
			return wakeFull, true
		}
	case m.Kind == lockconn.GroupJoined:
		return wakeFull, true
	case m.Kind == lockconn.GroupReleased:
		return wakeLight, true
	case m.Kind == lockconn.GroupGone:
		g.gone[m.Member] = time.Now()
		return wakeFull, true
	case m.Kind == lockconn.GroupResigned && m.Member == sender && g.owns(tagKey{m.Key.C, m.Key.O, m.Key.S}, sender):
		// Only the heir need act now.
		k := tagKey{m.Key.C, m.Key.O, m.Key.S}
		g.holds[k] = resignHold{member: sender, until: time.Now().Add(10 * g.cfg.RenewInterval)}
		g.dirty = true
		heir := m.To == g.cfg.Identity
		if heir {
			g.gifts[k] = true
		}
		return wakeLight, heir
	}
	g.stats.dropped++
	return 0, false
}

// hintEvery is how often a message from a session that is not a known
// member may trigger a full round.
func (g *Group) hintEvery() time.Duration { return max(g.cfg.RenewInterval/4, time.Millisecond) }

// owns reports whether member owns key k as this member sees it: the last
// assignment gives k to member, or member's own resign of k is already
// held (g.mu held).
func (g *Group) owns(k tagKey, member string) bool {
	if h, ok := g.holds[k]; ok && h.member == member {
		return true
	}
	i, ok := g.index[k]
	if !ok || i >= len(g.owner) || g.owner[i] < 0 || g.owner[i] >= len(g.assigned) {
		return false
	}
	return g.assigned[g.owner[i]] == member
}

// lockTable is the server's lock table as a session read it at its start.
type lockTable struct{ perTx, conns, prepared int }

// checkCapacity reads the lock table's size on a fresh session (a session
// whose statement failed cannot read it) and refuses a group it cannot
// hold.
func (g *Group) checkCapacity(ctx context.Context, conn *pgx.Conn) error {
	var lt lockTable
	if err := conn.QueryRow(ctx, `SELECT current_setting('max_locks_per_transaction')::int, current_setting('max_connections')::int,
  current_setting('max_prepared_transactions')::int`).Scan(&lt.perTx, &lt.conns, &lt.prepared); err != nil {
		return err
	}
	g.mu.Lock()
	g.table = lt
	k := len(g.keys)
	g.mu.Unlock()
	return lt.error(k, nil)
}

// error is the LockTableError of a group of keys that does not fit, or
// of a full table (cause); nil when the group fits and nothing failed.
func (lt lockTable) error(keys int, cause error) error {
	capacity := lt.perTx * (lt.conns + lt.prepared)
	if 2*keys <= capacity && cause == nil {
		return nil
	}
	need := (2*keys + lt.conns + lt.prepared - 1) / max(1, lt.conns+lt.prepared)
	return &LockTableError{Keys: keys, Capacity: capacity, MaxLocksPerTransaction: max(need, lt.perTx+1), Err: cause}
}

// tableFull handles SQLSTATE 53200 from an exchange. A group that fits the
// table (it passed the start's check) met a table another session filled:
// no key is taken this round (those won before the error are adopted at
// the next full round), the session goes on, and the exchange is tried
// again at the next full round; a Warn at most once a minute, a count in
// Status, and LastError say so. A group that can never fit ends Run.
func (g *Group) tableFull(cause error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	err := g.table.error(len(g.keys), cause)
	if 2*len(g.keys) > g.table.perTx*(g.table.conns+g.table.prepared) {
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

// scanSQL proves this session's locks and reads the members, in one scan
// of pg_locks: one row per advisory lock this backend holds exclusively
// (outside pgleader's own space), then one per member, with its backend
// pid. A member is a session of this session's own login role that holds
// the roster lock: any role can take that lock, and a session of another
// role that does is not a member (keys assigned to it would go unled). It
// reads no shared catalog (see the lockconn package doc): a round must
// renew the keys while another role fills the lock table.
var scanSQL = `WITH l AS MATERIALIZED (SELECT classid, objid, objsubid, pid, granted, mode FROM pg_locks
  WHERE locktype = 'advisory' AND database = (SELECT datid FROM pg_stat_get_activity(pg_backend_pid())))
SELECT true, classid, objid, objsubid, '', 0 FROM l WHERE pid = pg_backend_pid() AND granted AND mode = 'ExclusiveLock' AND classid <> ` + fmt.Sprint(uint32(lockconn.HeirClass)) + `
UNION ALL
SELECT false, 0, 0, 0, coalesce(a.application_name, ''), l.pid FROM l JOIN pg_stat_get_activity(NULL) a ON a.pid = l.pid
  WHERE l.classid = ` + fmt.Sprint(uint32(lockconn.HeirClass)) + ` AND l.objid = $1::oid AND l.objsubid = 2 AND l.granted
    AND a.usesysid = (SELECT usesysid FROM pg_stat_get_activity(pg_backend_pid()))`

const checkSQL = `SELECT pg_backend_pid(), current_setting('pgleader.owner', true), pg_is_in_recovery()`

// round is one round: prove and renew every key, read the members, hand
// over what is no longer this member's, release what is handed over, and
// take what is.
func (g *Group) round(ctx context.Context, conn *pgx.Conn, sess lockconn.Session, full bool) error {
	c := g.cfg
	sent := time.Now()
	g.mu.Lock()
	if !full && !sent.Before(g.trustEnd) && len(g.owned) > 0 {
		full = true // the keys are in doubt: only a full round may go on
	}
	// While it leads keys, the round must answer within the trust window
	// (a deadline already past fails it at once: the keys are in doubt).
	deadline := g.trustEnd
	if len(g.owned) == 0 {
		deadline = sent.Add(c.RenewDeadline)
	}
	g.mu.Unlock()
	rctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	held, members, pids := map[tagKey]bool{}, []string(nil), map[uint32]string(nil)
	if full {
		g.mu.Lock()
		hook, joined, gone := g.testRound, g.joined, g.goneOut
		g.goneOut = nil
		g.mu.Unlock()
		if hook != nil {
			hook(rctx, conn)
		}
		if !joined {
			if err := g.tryJoin(rctx, conn); err != nil {
				return err
			}
		}
		marker := g.marker()
		if marker != g.markerSQL {
			// Prepared like the round's other statements, again only when
			// the key count changes.
			if _, err := conn.Prepare(rctx, marker, marker); err != nil {
				return err
			}
			if g.markerSQL != "" {
				conn.Deallocate(rctx, g.markerSQL)
			}
			g.markerSQL = marker
		}
		b := &pgx.Batch{}
		b.Queue(checkSQL)
		b.Queue(scanSQL, uint32(g.roster))
		if len(gone) > 0 {
			// What the crash watch saw, from this session (whose pid the
			// others know): they run a round at once.
			b.Queue(syncOffSQL)
			for _, m := range gone {
				b.Queue(notifySQL, g.channel, lockconn.EncodeGroup(m))
			}
		}
		b.Queue(marker)
		br := conn.SendBatch(rctx, b)
		var err error
		held, members, pids, err = readScan(br, sess)
		br.Close()
		if err != nil {
			if rctx.Err() != nil {
				return fmt.Errorf("%w: no answer within the trust window: %w", leader.ErrRenewDeadline, err)
			}
			return err
		}
	}

	g.mu.Lock()
	g.stats.lastStep = time.Now()
	if full {
		g.stats.rounds++
		g.stats.lastRound, g.stats.lastErr = sent, g.joinErr
		g.members, g.pids = members, pids
		g.trustEnd = sent.Add(c.RenewDeadline)
		g.watchNext(sent)
		// Keys whose lock is gone: demoted alone, nothing to release.
		for k, t := range g.owned {
			if !held[k] {
				g.end(k, t, leader.ErrLockLost)
			}
		}
	} else {
		// A light round proves no lock: it goes by what this member
		// holds, and does not extend the trust window.
		g.stats.light++
		members = g.members
		for k := range g.owned {
			held[k] = true
		}
	}
	now := time.Now()
	for k, h := range g.holds {
		if now.After(h.until) {
			delete(g.holds, k)
			g.dirty = true
		}
	}
	// Assign again when the keys or the members changed, and at a full
	// round when the holds did. Between, a light round goes by the last
	// assignment, less the keys this member resigned, plus the keys
	// resigned to it: a hand-over does not wait for an assignment.
	// Members changed: tell them of this member's resigns still held (a
	// member that joined since has not heard of them, and would assign
	// those keys back to this member, which would not take them).
	var rebroadcast []lockconn.GroupMessage
	if full {
		rebroadcast, g.pending = g.pending, nil
	}
	if full && !slices.Equal(members, g.assigned) {
		for k, h := range g.holds {
			if h.member == c.Identity {
				if heir := heirOf(k, members, c.Identity); heir != "" {
					rebroadcast = append(rebroadcast, resignedMessage(c.Identity, k, heir))
				}
			}
		}
	}
	if g.rekey || !slices.Equal(members, g.assigned) || full && g.dirty {
		g.owner, g.assigned, g.rekey, g.dirty = assign(g.order, members, g.holds), members, false, false
		g.mine, g.gifts = map[tagKey]bool{}, map[tagKey]bool{}
		if me := slices.Index(g.assigned, c.Identity); me >= 0 {
			for i, o := range g.owner {
				if o == me {
					g.mine[g.order[i]] = true
				}
			}
		}
	}
	mine := map[tagKey]bool{}
	if !g.stopping {
		mine = g.mine
		if len(g.gifts) > 0 {
			mine = maps.Clone(mine)
			for k := range g.gifts {
				if _, ok := g.keys[k]; ok {
					mine[k] = true
				}
			}
		}
	}
	// Hand over what is no longer ours; release what is handed over and
	// done (or past ReleaseTimeout).
	var unlock []tagKey
	var released []*groupTerm
	var resigned []lockconn.GroupMessage
	for k, t := range g.owned {
		if !mine[k] {
			g.release(t, leader.ErrResigned)
		}
		if !t.releasing {
			select {
			case <-t.done:
				// OnElected returned by itself: hand over.
				g.release(t, leader.ErrCallbackReturned)
				g.holds[k] = resignHold{member: c.Identity, until: now.Add(c.RenewInterval)}
			default:
			}
		}
		if t.releasing {
			select {
			case <-t.done:
			default:
				if now.Before(t.releaseAt) {
					continue
				}
				g.log.Error("OnElected did not return within ReleaseTimeout after its context was cancelled; releasing the key while it still runs",
					zap.Stringer("key", t.l.Key))
			}
			unlock = append(unlock, k)
			released = append(released, t)
			if h, ok := g.holds[k]; ok && h.member == c.Identity && errors.Is(t.reason, leader.ErrResigned) {
				resigned = append(resigned, resignedMessage(c.Identity, k, heirOf(k, members, c.Identity)))
			}
		}
	}
	// Held but not owned: a lock won in a round that failed after it. Keep
	// it if it is ours, else release it.
	var adopt []tagKey
	for k := range held {
		if _, ok := g.owned[k]; ok || slices.Contains(unlock, k) {
			continue
		}
		if _, busy := g.ending[k]; mine[k] && !busy {
			adopt = append(adopt, k)
		} else {
			unlock = append(unlock, k)
		}
	}
	var want []tagKey
	for k := range mine {
		if h, ok := g.holds[k]; ok && h.member == c.Identity {
			continue // resigned, or returned by itself: not taken back yet
		}
		if _, busy := g.ending[k]; !held[k] && !busy {
			want = append(want, k)
		}
	}
	g.mu.Unlock()

	if len(rebroadcast) > 0 {
		if err := g.broadcast(rctx, conn, rebroadcast); err != nil {
			return err
		}
	}
	if len(unlock) == 0 && len(want) == 0 && len(adopt) == 0 {
		return nil
	}
	if ce := g.log.Check(zap.DebugLevel, "exchange"); ce != nil {
		ce.Write(zap.Int("unlock", len(unlock)), zap.Int("want", len(want)), zap.Int("adopt", len(adopt)), zap.Int("held", len(held)), zap.Strings("members", members))
	}
	won, unlocked, err := g.exchange(rctx, conn, sess, !full, unlock, want, resigned)
	if errors.Is(err, errTableFull) {
		err = g.tableFull(err)
	}
	if (err == nil || unlocked) && len(resigned) > 0 {
		// The others hear of the resign with the next full round's batch,
		// off the hand-over's path: they need it only to assign as the
		// heir does, and a resign changes no key of theirs.
		g.mu.Lock()
		g.pending = append(g.pending, resigned...)
		g.mu.Unlock()
	}
	if err == nil || unlocked {
		// Released: each one's OnDemoted, now that its lock is free.
		g.mu.Lock()
		for _, t := range released {
			g.end(tagOf(t.l.Key), t, t.reason)
		}
		g.mu.Unlock()
	}
	if err != nil {
		return err
	}
	won = append(won, adopt...)
	if len(won) == 0 {
		return nil
	}
	termOf := map[tagKey]int64{}
	if g.termSQL != "" {
		termOf, err = g.bump(rctx, conn, won)
		if lockconn.IsLockTimeout(err) {
			// A term row is locked by an old leader's transaction: keep
			// the locks, adopt them next round.
			g.log.Warn("could not install the next fencing terms yet; trying again next round", zap.Error(err))
			return nil
		}
		if err != nil {
			return err
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, k := range won {
		key, ok := g.keys[k]
		if !ok || g.stopping {
			continue // released next round
		}
		g.begin(key, sess.PID, termOf[k])
	}
	return nil
}

// watchNext points the crash watch at the ring successor, and asks for
// a round soon while a member reported gone is still listed (g.mu held).
func (g *Group) watchNext(sent time.Time) {
	for m, at := range g.gone {
		switch {
		case sent.Sub(at) > 100*time.Millisecond:
			delete(g.gone, m)
		case slices.Contains(g.members, m):
			g.soon = true
		}
	}
	if g.ring == nil {
		return
	}
	if next := ringNext(g.members, g.cfg.Identity); next != g.ringLast {
		g.ringLast = next
		select {
		case <-g.ring: // replace a target not yet read
		default:
		}
		g.ring <- next
	}
}

// readScan reads the check and the scan: this session's keys, the
// members' names and their main sessions' pids.
func readScan(br pgx.BatchResults, sess lockconn.Session) (map[tagKey]bool, []string, map[uint32]string, error) {
	if err := readCheck(br, sess); err != nil {
		return nil, nil, nil, err
	}
	rows, err := br.Query()
	if err != nil {
		return nil, nil, nil, err
	}
	defer rows.Close()
	held, pids := map[tagKey]bool{}, map[uint32]string{}
	var members []string
	for rows.Next() {
		var own bool
		var c, o uint32
		var s int16
		var member string
		var pid int32
		if err := rows.Scan(&own, &c, &o, &s, &member, &pid); err != nil {
			return nil, nil, nil, err
		}
		if own {
			held[tagKey{c, o, s}] = true
		} else {
			members = append(members, member)
			pids[uint32(pid)] = member
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, nil, err
	}
	slices.Sort(members)
	return held, slices.Compact(members), pids, nil
}

// resignedMessage tells the group that member resigned k to heir.
func resignedMessage(member string, k tagKey, heir string) lockconn.GroupMessage {
	return lockconn.GroupMessage{Kind: lockconn.GroupResigned, Member: member, Key: lockconn.Tag3{C: k.c, O: k.o, S: k.s}, To: heir}
}

// heirChannel is the NOTIFY channel of one member: a resign tells the
// member that gets the key there first.
func (g *Group) heirChannel(identity string) string {
	return fmt.Sprintf("%s.%d", g.channel, uint32(memberLock(g.cfg.Group, identity)))
}

// broadcast tells the whole group of resigns whose heirs were told alone.
func (g *Group) broadcast(ctx context.Context, conn *pgx.Conn, resigned []lockconn.GroupMessage) error {
	b := &pgx.Batch{}
	for _, r := range resigned {
		b.Queue(notifySQL, g.channel, lockconn.EncodeGroup(r))
	}
	b.Queue(g.marker())
	return conn.SendBatch(ctx, b).Close()
}

// heirOf is the member that gets a key member me resigned: the one that
// ranks it highest but me, as assign gives a held key.
func heirOf(k tagKey, members []string, me string) string {
	best, bestScore := "", uint64(0)
	for _, name := range members {
		if name == me {
			continue
		}
		if s := score(k, name); best == "" || s > bestScore {
			best, bestScore = name, s
		}
	}
	return best
}

// readCheck reads checkSQL's answer: the session's own backend, with its
// token, on a primary.
func readCheck(br pgx.BatchResults, sess lockconn.Session) error {
	var pid int32
	var token *string
	var standby bool
	if err := br.QueryRow().Scan(&pid, &token, &standby); err != nil {
		return lockconn.Pooling(err)
	}
	if standby {
		return leader.ErrStandby
	}
	tok := ""
	if token != nil {
		tok = *token
	}
	return sess.Same(pid, tok)
}

// exchangeGuard makes the exchange's lock calls a no-op on any backend but
// the session's own, with its token, on a primary ($1 and $2: pid, token):
// a light round sends its check in the same round trip, so nothing may be
// locked or unlocked before the check is read.
const exchangeGuard = `CASE WHEN pg_backend_pid() = $1 AND current_setting('pgleader.owner', true) = $2 AND NOT pg_is_in_recovery() THEN `

// The exchange's statements.
const (
	syncOffSQL    = `SELECT set_config('synchronous_commit', 'off', true)`
	unlockSQL     = `SELECT count(*) FILTER (WHERE ` + exchangeGuard + `pg_advisory_unlock(k) ELSE false END) FROM unnest($3::int8[]) k`
	unlockPairSQL = `SELECT count(*) FILTER (WHERE ` + exchangeGuard + `pg_advisory_unlock(a, b) ELSE false END) FROM unnest($3::int4[], $4::int4[]) AS u(a, b)`
	notifySQL     = `SELECT pg_notify($1, $2)`
	tryLockSQL    = `SELECT ((k >> 32) & 4294967295)::oid, (k & 4294967295)::oid, 1::int2 FROM unnest($3::int8[]) k WHERE ` + exchangeGuard + `pg_try_advisory_lock(k) ELSE false END
UNION ALL SELECT (a::int8 & 4294967295)::oid, (b::int8 & 4294967295)::oid, 2::int2 FROM unnest($4::int4[], $5::int4[]) AS u(a, b) WHERE ` + exchangeGuard + `pg_try_advisory_lock(a, b) ELSE false END`
)

// prepare prepares the statements of a round and an exchange, once per
// session: a round then costs the server no parse and no plan. The session
// is dedicated (every round checks its backend pid and token), as a quiet
// elector's is; the connection's own exec mode stays as the Connector set
// it for everything else.
func (g *Group) prepare(ctx context.Context, conn *pgx.Conn) error {
	for _, q := range []string{checkSQL, scanSQL, syncOffSQL, unlockSQL, unlockPairSQL, notifySQL, tryLockSQL} {
		if _, err := conn.Prepare(ctx, q, q); err != nil {
			return err
		}
	}
	return nil
}

// exchange releases unlock and tries want, in one round trip; it tells the
// group when it released anything. It returns the keys won. check sends
// the session check first, in the same round trip (a light round, which
// read nothing before).
func (g *Group) exchange(ctx context.Context, conn *pgx.Conn, sess lockconn.Session, check bool, unlock, want []tagKey,
	resigned []lockconn.GroupMessage) (won []tagKey, unlocked bool, err error) {
	b := &pgx.Batch{}
	pid, tok := int32(sess.PID), sess.Token
	if check {
		b.Queue(checkSQL)
	}
	// The batch is one implicit transaction; its NOTIFY makes it commit a
	// record, which need not wait for a WAL flush: nothing in it is
	// durable state (the fencing terms are written apart, durably).
	b.Queue(syncOffSQL)
	nNotify := 0
	if len(unlock) > 0 {
		i8, pa, pb := split(unlock)
		b.Queue(unlockSQL, pid, tok, i8)
		b.Queue(unlockPairSQL, pid, tok, pa, pb)
		before := len(b.QueuedQueries)
		// Each resigned key's heir first, alone: the others hear of the
		// resigns (they need them for the same assignment) just after, off
		// the hand-over's path (see broadcast).
		others := len(resigned) == 0
		for _, r := range resigned {
			if r.To != "" {
				b.Queue(notifySQL, g.heirChannel(r.To), lockconn.EncodeGroup(r))
			}
		}
		if len(unlock) > len(resigned) {
			others = true
		}
		if others {
			b.Queue(notifySQL, g.channel, lockconn.EncodeGroup(lockconn.GroupMessage{Kind: lockconn.GroupReleased}))
		}
		nNotify = len(b.QueuedQueries) - before
	}
	if len(want) > 0 {
		i8, pa, pb := split(want)
		b.Queue(tryLockSQL, pid, tok, i8, pa, pb)
	}
	b.Queue(g.marker())
	br := conn.SendBatch(ctx, b)
	defer br.Close()
	if check {
		if err := readCheck(br, sess); err != nil {
			return nil, false, err
		}
	}
	if _, err := br.Exec(); err != nil {
		return nil, false, err
	}
	if len(unlock) > 0 {
		for range 2 {
			if _, err := br.Exec(); err != nil {
				return nil, false, err
			}
		}
		// Unlocked: session locks do not roll back with the batch's
		// transaction, whatever fails after (the NOTIFYs do).
		unlocked = true
		for range nNotify {
			if _, err := br.Exec(); err != nil {
				return nil, true, err
			}
		}
	}
	if len(want) > 0 {
		rows, err := br.Query()
		if err != nil {
			return nil, unlocked, err
		}
		for rows.Next() {
			var t tagKey
			if err := rows.Scan(&t.c, &t.o, &t.s); err != nil {
				rows.Close()
				return nil, unlocked, err
			}
			won = append(won, t)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "53200" {
				return nil, unlocked, fmt.Errorf("%w: %w", errTableFull, err)
			}
			return nil, unlocked, err
		}
	}
	return won, unlocked, br.Close()
}

// errTableFull: the server's shared lock table was full (SQLSTATE 53200)
// when the exchange took keys; see tableFull.
var errTableFull = errors.New("the server's lock table is full")

// split sorts keys into int8 keys and pair keys, as the lock functions take
// them.
func split(keys []tagKey) (i8 []int64, pa, pb []int32) {
	i8, pa, pb = []int64{}, []int32{}, []int32{}
	for _, k := range keys {
		if k.s == 1 {
			i8 = append(i8, int64(uint64(k.c)<<32|uint64(k.o)))
		} else {
			pa, pb = append(pa, int32(k.c)), append(pb, int32(k.o))
		}
	}
	return i8, pa, pb
}

// groupBumpSQL installs the next term of several keys at once.
func groupBumpSQL(quoted string) string {
	return `INSERT INTO ` + quoted + ` AS t (classid, objid, objsubid, key_name, term, holder, elected_at)
SELECT c, o, s, n, 1, $5::text, now() FROM unnest($1::oid[], $2::oid[], $3::int2[], $4::text[]) AS u(c, o, s, n)
ON CONFLICT (classid, objid, objsubid) DO UPDATE SET term = t.term + 1, holder = EXCLUDED.holder, elected_at = EXCLUDED.elected_at
RETURNING classid, objid, objsubid, term`
}

// bump installs the next term of each key won.
func (g *Group) bump(ctx context.Context, conn *pgx.Conn, won []tagKey) (map[tagKey]int64, error) {
	var cs, os []uint32
	var ss []int16
	var names []string
	g.mu.Lock()
	for _, k := range won {
		cs, os, ss = append(cs, k.c), append(os, k.o), append(ss, k.s)
		names = append(names, g.keys[k].String())
	}
	g.mu.Unlock()
	rows, err := conn.Query(ctx, g.termSQL, cs, os, ss, names, g.cfg.Identity)
	if err != nil {
		return nil, terms.Classify(err, g.cfg.Fencing.Table)
	}
	defer rows.Close()
	out := map[tagKey]int64{}
	for rows.Next() {
		var k tagKey
		var term int64
		if err := rows.Scan(&k.c, &k.o, &k.s, &term); err != nil {
			return nil, err
		}
		out[k] = term
	}
	if err := rows.Err(); err != nil {
		return nil, terms.Classify(err, g.cfg.Fencing.Table)
	}
	return out, nil
}

// begin starts a key's tenure (g.mu held).
func (g *Group) begin(key leader.Key, pid uint32, term int64) {
	l := leader.Leadership{Key: key, Identity: g.cfg.Identity, Term: term, ElectedAt: time.Now(), BackendPID: pid}
	if g.cfg.Fencing.Enabled {
		l.TermsTable = g.termsTable
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	t := &groupTerm{l: l, cancel: cancel, done: make(chan struct{}), demoted: make(chan struct{})}
	g.owned[tagOf(key)] = t
	g.stats.elected++
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		defer g.poke() // a hand-over waits for this
		defer close(t.done)
		g.cfg.Callbacks.OnElected(ctx, l)
	}()
	g.log.Debug("elected", zap.Stringer("key", key), zap.Int64("term", term))
}

// end takes t out of g.owned (g.mu held): its context is cancelled at
// once, and OnDemoted runs on a goroutine of its own once OnElected has
// returned (or ReleaseTimeout passed); until then the key stays in
// g.ending and is not taken again.
func (g *Group) end(k tagKey, t *groupTerm, reason error) {
	g.log.Debug("demoted", zap.Stringer("key", t.l.Key), zap.NamedError("reason", reason))
	delete(g.owned, k)
	g.ending[k] = t
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
		if g.ending[k] == t {
			delete(g.ending, k)
		}
		g.mu.Unlock()
		close(t.demoted)
		g.poke()
	}()
}

// demoteAll ends every tenure when the session ends: after a fault the
// locks are gone with it.
func (g *Group) demoteAll(err error) {
	switch {
	case err == nil:
		err = leader.ErrConnectionLost
	case errors.Is(err, leader.ErrConnectionLost), errors.Is(err, leader.ErrRenewDeadline), errors.Is(err, leader.ErrStandby),
		errors.Is(err, leader.ErrTransactionPooling), errors.Is(err, leader.ErrLockLost), errors.Is(err, leader.ErrNoTermsTable),
		errors.Is(err, leader.ErrReadOnly), errors.Is(err, ErrLockTable), errors.Is(err, context.Canceled):
	default:
		// Anything else on the wire (a server shutting down sends FATAL
		// 57P01 to a statement in flight) ended the session.
		err = fmt.Errorf("%w: %w", leader.ErrConnectionLost, err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for k, t := range g.owned {
		reason := err
		if t.releasing && g.stopping {
			reason = t.reason
		}
		g.end(k, t, reason)
	}
	g.trustEnd = time.Time{}
}

// keyOrder returns the keys in the order assign takes them: by their own
// hash, then by lock tag.
func keyOrder(keys map[tagKey]leader.Key) []tagKey {
	type hashed struct {
		k tagKey
		h uint64
	}
	hs := make([]hashed, 0, len(keys))
	for k := range keys {
		hs = append(hs, hashed{k, keyHash(k)})
	}
	sort.Slice(hs, func(i, j int) bool {
		if hs[i].h != hs[j].h {
			return hs[i].h < hs[j].h
		}
		a, b := hs[i].k, hs[j].k
		return a.c < b.c || a.c == b.c && (a.o < b.o || a.o == b.o && a.s < b.s)
	})
	order := make([]tagKey, len(hs))
	for i, h := range hs {
		order[i] = h.k
	}
	return order
}

// assign gives each key in order (see keyOrder) to one of members, and
// returns, per key, the index of its member (-1 with no members):
// rendezvous hashing with bounded loads. Every key, in that order, goes to
// the member that ranks it highest among those with room left; each member
// has room for ⌊K/M⌋ keys, the first K mod M members (in name order) for
// one more. A held key (resigned by a member) goes, in its turn, to the
// member that ranks it highest but the one that resigned it, past the
// bound when needed, and counts against the one that resigned it: every
// other key then sees the same room as without the hold, so a resign moves
// that key only.
func assign(order []tagKey, members []string, holds map[tagKey]resignHold) []int {
	owner := make([]int, len(order))
	m := len(members)
	if m == 0 {
		for i := range owner {
			owner[i] = -1
		}
		return owner
	}
	room := make([]int, m)
	for i := range room {
		room[i] = len(order) / m
		if i < len(order)%m {
			room[i]++
		}
	}
	pick := func(k tagKey, avoid int, bounded bool) int {
		best, bestScore := -1, uint64(0)
		for i, name := range members {
			if i == avoid || bounded && room[i] <= 0 {
				continue
			}
			if s := score(k, name); best < 0 || s > bestScore {
				best, bestScore = i, s
			}
		}
		if best >= 0 {
			if avoid >= 0 {
				room[avoid]--
			} else {
				room[best]--
			}
		}
		return best
	}
	// A held key is given in its own turn, so that every other key sees
	// the same room as without the hold and goes to the same member.
	for i, k := range order {
		if h, ok := holds[k]; ok && m > 1 {
			if a := slices.Index(members, h.member); a >= 0 {
				owner[i] = pick(k, a, false)
				continue
			}
		}
		owner[i] = pick(k, -1, true)
	}
	return owner
}

// FNV-1a, 64 bits, over a key's lock tag and a member's name: the same in
// every process and every version of this package (the assignment depends
// on it, so members must agree).
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

func fnvTag(h uint64, k tagKey) uint64 {
	for _, v := range [...]uint32{k.c, k.o, uint32(uint16(k.s))} {
		for i := 0; i < 32; i += 8 {
			h = (h ^ uint64(byte(v>>i))) * fnvPrime
		}
	}
	return h
}

func keyHash(k tagKey) uint64 { return mix(fnvTag(fnvOffset, k)) }

func score(k tagKey, member string) uint64 {
	h := fnvTag(fnvOffset, k)
	h = (h ^ '|') * fnvPrime
	for i := 0; i < len(member); i++ {
		h = (h ^ uint64(member[i])) * fnvPrime
	}
	return mix(h)
}

// mix finishes a hash with a multiply-xorshift: fnv's low bits mix poorly
// for similar inputs.
func mix(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	return x
}
