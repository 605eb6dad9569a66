package elector

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/pgleader/pgleader/internal/lockconn"
	"github.com/pgleader/pgleader/internal/terms"
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
	// the README's Group section for what happens while they differ.
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
}

// ErrLockTable is returned (wrapped) by NewGroup's Run when the server's
// shared lock table cannot hold the group: see LockTableError.
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
	ran     atomic.Bool
	wake    chan struct{}

	wg sync.WaitGroup // every OnElected and OnDemoted goroutine

	mu       sync.Mutex
	keys     map[tagKey]leader.Key
	owned    map[tagKey]*groupTerm
	ending   map[tagKey]*groupTerm // demoted, OnDemoted still to come: not taken again until then
	members  []string
	trustEnd time.Time             // IsLeader is false past it
	holds    map[tagKey]resignHold // keys resigned by a member: not assigned to it for a while
	stopping bool
	termSQL  string
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
	if cfg.Group == "" || len(cfg.Group) > 200 {
		return nil, &ConfigError{Field: "Group", Rule: "must be 1 to 200 bytes"}
	}
	g := &Group{cfg: cfg, wake: make(chan struct{}, 1), owned: map[tagKey]*groupTerm{}, ending: map[tagKey]*groupTerm{}, holds: map[tagKey]resignHold{}}
	if err := g.setKeys(cfg.Keys); err != nil {
		return nil, err
	}
	h := fnv.New32a()
	fmt.Fprintf(h, "group|%s", cfg.Group)
	g.roster = int32(h.Sum32())
	g.channel = fmt.Sprintf("pgleader.group.%d", uint32(g.roster))
	g.log = cfg.Logger.With(zap.String("group", cfg.Group), zap.String("identity", cfg.Identity))
	if cfg.Fencing.Enabled {
		q, _ := terms.Quote(cfg.Fencing.Table)
		g.termSQL = groupBumpSQL(q)
	}
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
	g.mu.Lock()
	g.keys = m
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
// from this member for ten renew intervals. It returns once OnDemoted ran,
// or leader.ErrNotLeader when this member does not lead key.
func (g *Group) Resign(ctx context.Context, key leader.Key) error {
	g.mu.Lock()
	t := g.owned[tagOf(key)]
	if t == nil || t.releasing {
		g.mu.Unlock()
		return leader.ErrNotLeader
	}
	g.holds[tagOf(key)] = resignHold{member: g.cfg.Identity, until: time.Now().Add(10 * g.cfg.RenewInterval)}
	g.release(t, leader.ErrResigned)
	g.mu.Unlock()
	g.poke()
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
	r := newRetry(g.cfg.ReconnectMaxDelay, g.cfg.RenewInterval, g.cfg.LeaseDuration)
	for {
		began := time.Now()
		err := g.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if Permanent(err) || errors.Is(err, ErrLockTable) {
			g.log.Error("giving up: retrying cannot fix this", zap.Error(err))
			return err
		}
		attempt, delay := r.next(time.Since(began), err)
		r.log(g.log, attempt, delay, err)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
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
	if err := g.checkCapacity(sctx, conn); err != nil {
		return err
	}
	if c.Fencing.Enabled {
		if err := terms.Ensure(sctx, conn, c.Fencing.Table, !c.Fencing.NoCreate); err != nil {
			return fmt.Errorf("fencing: %w", err)
		}
	}
	// Join: the roster lock, the channel, and a word to the others.
	if _, err := conn.Exec(sctx, "LISTEN "+pgx.Identifier{g.channel}.Sanitize()+
		fmt.Sprintf(";\nSELECT pg_try_advisory_lock_shared(%d, %d), pg_notify('%s', 'joined')", lockconn.HeirClass, g.roster, g.channel),
		pgx.QueryExecModeSimpleProtocol); err != nil {
		return err
	}
	g.log.Info("joined")
	for {
		// The next round is due RenewInterval after this one began, however
		// many early rounds notifications caused: the trust window runs
		// from the last round.
		began := time.Now()
		if err := g.round(ctx, conn, sess); err != nil {
			return err
		}
		g.mu.Lock()
		done := g.stopping && len(g.owned) == 0
		g.mu.Unlock()
		if done {
			return nil
		}
		if err := g.idle(ctx, conn, began.Add(c.RenewInterval)); err != nil {
			return err
		}
	}
}

// idle reads the session until `until`, a poke, or a notification on the
// group's channel (a member joined, or a key was released or resigned).
func (g *Group) idle(ctx context.Context, conn *pgx.Conn, until time.Time) error {
	wctx, cancel := context.WithDeadline(context.Background(), until)
	defer cancel()
	g.mu.Lock()
	stopping := g.stopping
	g.mu.Unlock()
	if !stopping {
		stop := context.AfterFunc(ctx, cancel)
		defer stop()
	}
	go func() {
		select {
		case <-g.wake:
			cancel()
		case <-wctx.Done():
		}
	}()
	for {
		n, err := conn.WaitForNotification(wctx)
		switch {
		case err == nil:
			if g.heard(n) {
				return nil
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
			return nil
		case wctx.Err() != nil:
			return nil
		default:
			return fmt.Errorf("%w: %w", leader.ErrConnectionLost, err)
		}
	}
}

// heard handles a notification; it reports whether a round should run now.
func (g *Group) heard(n *pgconn.Notification) bool {
	if n.Channel != g.channel {
		return false
	}
	if member, tag, ok := strings.Cut(n.Payload, " resigned "); ok {
		var t tagKey
		if _, err := fmt.Sscanf(tag, "%d.%d.%d", &t.c, &t.o, &t.s); err == nil {
			g.mu.Lock()
			g.holds[t] = resignHold{member: member, until: time.Now().Add(10 * g.cfg.RenewInterval)}
			g.mu.Unlock()
		}
	}
	return true
}

// checkCapacity refuses a group the server's lock table cannot hold.
func (g *Group) checkCapacity(ctx context.Context, conn *pgx.Conn) error {
	var perTx, conns, prepared int
	if err := conn.QueryRow(ctx, `SELECT current_setting('max_locks_per_transaction')::int, current_setting('max_connections')::int,
  current_setting('max_prepared_transactions')::int`).Scan(&perTx, &conns, &prepared); err != nil {
		return err
	}
	g.mu.Lock()
	k := len(g.keys)
	g.mu.Unlock()
	return g.capacityError(k, perTx, conns, prepared, nil)
}

func (g *Group) capacityError(keys, perTx, conns, prepared int, cause error) error {
	capacity := perTx * (conns + prepared)
	if 2*keys <= capacity && cause == nil {
		return nil
	}
	need := (2*keys + conns + prepared - 1) / (conns + prepared)
	return &LockTableError{Keys: keys, Capacity: capacity, MaxLocksPerTransaction: max(need, perTx+1), Err: cause}
}

// scanSQL proves this session's locks and reads the members, in one scan
// of pg_locks: one row per advisory lock this backend holds exclusively
// (outside pgleader's own space), then one per member.
var scanSQL = `WITH l AS MATERIALIZED (SELECT classid, objid, objsubid, pid, granted, mode FROM pg_locks
  WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))
SELECT true, classid, objid, objsubid, '' FROM l WHERE pid = pg_backend_pid() AND granted AND mode = 'ExclusiveLock' AND classid <> ` + fmt.Sprint(uint32(lockconn.HeirClass)) + `
UNION ALL
SELECT false, 0, 0, 0, coalesce(a.application_name, '') FROM l JOIN pg_stat_activity a USING (pid)
  WHERE l.classid = ` + fmt.Sprint(uint32(lockconn.HeirClass)) + ` AND l.objid = $1::oid AND l.objsubid = 2 AND l.granted`

const checkSQL = `SELECT pg_backend_pid(), current_setting('pgleader.owner', true), pg_is_in_recovery()`

// round is one round: prove and renew every key, read the members, hand
// over what is no longer this member's, release what is handed over, and
// take what is.
func (g *Group) round(ctx context.Context, conn *pgx.Conn, sess lockconn.Session) error {
	c := g.cfg
	sent := time.Now()
	g.mu.Lock()
	// While it leads keys, the round must answer within the trust window
	// (a deadline already past fails it at once: the keys are in doubt).
	deadline := g.trustEnd
	if len(g.owned) == 0 {
		deadline = sent.Add(c.RenewDeadline)
	}
	g.mu.Unlock()
	rctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	b := &pgx.Batch{}
	b.Queue(checkSQL)
	b.Queue(scanSQL, uint32(g.roster))
	br := conn.SendBatch(rctx, b)
	held, members, err := readScan(br, sess)
	br.Close()
	if err != nil {
		if rctx.Err() != nil {
			return fmt.Errorf("%w: no answer within the trust window: %w", leader.ErrRenewDeadline, err)
		}
		return err
	}

	g.mu.Lock()
	g.members = members
	g.trustEnd = sent.Add(c.RenewDeadline)
	// Keys whose lock is gone: demoted alone, nothing to release.
	for k, t := range g.owned {
		if !held[k] {
			g.end(k, t, leader.ErrLockLost)
		}
	}
	now := time.Now()
	for k, h := range g.holds {
		if now.After(h.until) {
			delete(g.holds, k)
		}
	}
	mine := map[tagKey]bool{}
	if !g.stopping {
		mine = assign(g.keys, members, g.holds, c.Identity)
	}
	// Hand over what is no longer ours; release what is handed over and
	// done (or past ReleaseTimeout).
	var unlock []tagKey
	var released []*groupTerm
	var resigned string
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
				resigned = fmt.Sprintf("%s resigned %d.%d.%d", c.Identity, k.c, k.o, k.s)
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
		if _, busy := g.ending[k]; !held[k] && !busy {
			want = append(want, k)
		}
	}
	g.mu.Unlock()

	if len(unlock) == 0 && len(want) == 0 && len(adopt) == 0 {
		return nil
	}
	if ce := g.log.Check(zap.DebugLevel, "exchange"); ce != nil {
		ce.Write(zap.Int("unlock", len(unlock)), zap.Int("want", len(want)), zap.Int("adopt", len(adopt)), zap.Int("held", len(held)), zap.Strings("members", members))
	}
	won, err := g.exchange(rctx, conn, unlock, want, resigned)
	if err == nil {
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

// readScan reads the check and the scan.
func readScan(br pgx.BatchResults, sess lockconn.Session) (map[tagKey]bool, []string, error) {
	var pid int32
	var token *string
	var standby bool
	if err := br.QueryRow().Scan(&pid, &token, &standby); err != nil {
		return nil, nil, lockconn.Pooling(err)
	}
	if standby {
		return nil, nil, leader.ErrStandby
	}
	tok := ""
	if token != nil {
		tok = *token
	}
	if err := sess.Same(pid, tok); err != nil {
		return nil, nil, err
	}
	rows, err := br.Query()
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	held := map[tagKey]bool{}
	var members []string
	for rows.Next() {
		var own bool
		var c, o uint32
		var s int16
		var member string
		if err := rows.Scan(&own, &c, &o, &s, &member); err != nil {
			return nil, nil, err
		}
		if own {
			held[tagKey{c, o, s}] = true
		} else {
			members = append(members, member)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	slices.Sort(members)
	return held, slices.Compact(members), nil
}

// exchange releases unlock and tries want, in one round trip; it tells the
// group when it released anything. It returns the keys won.
func (g *Group) exchange(ctx context.Context, conn *pgx.Conn, unlock, want []tagKey, resigned string) ([]tagKey, error) {
	b := &pgx.Batch{}
	if len(unlock) > 0 {
		i8, pa, pb := split(unlock)
		payload := "released"
		if resigned != "" {
			payload = resigned
		}
		b.Queue(`SELECT count(*) FILTER (WHERE pg_advisory_unlock(k)) FROM unnest($1::int8[]) k`, i8)
		b.Queue(`SELECT count(*) FILTER (WHERE pg_advisory_unlock(a, b)) FROM unnest($1::int4[], $2::int4[]) AS u(a, b)`, pa, pb)
		b.Queue(`SELECT pg_notify($1, $2)`, g.channel, payload)
	}
	if len(want) > 0 {
		i8, pa, pb := split(want)
		b.Queue(`SELECT ((k >> 32) & 4294967295)::oid, (k & 4294967295)::oid, 1::int2 FROM unnest($1::int8[]) k WHERE pg_try_advisory_lock(k)
UNION ALL SELECT (a::int8 & 4294967295)::oid, (b::int8 & 4294967295)::oid, 2::int2 FROM unnest($2::int4[], $3::int4[]) AS u(a, b) WHERE pg_try_advisory_lock(a, b)`, i8, pa, pb)
	}
	br := conn.SendBatch(ctx, b)
	defer br.Close()
	if len(unlock) > 0 {
		for range 3 {
			if _, err := br.Exec(); err != nil {
				return nil, err
			}
		}
	}
	var won []tagKey
	if len(want) > 0 {
		rows, err := br.Query()
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var t tagKey
			if err := rows.Scan(&t.c, &t.o, &t.s); err != nil {
				rows.Close()
				return nil, err
			}
			won = append(won, t)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "53200" {
				return nil, g.lockTableFull(ctx, conn, err)
			}
			return nil, err
		}
	}
	return won, br.Close()
}

// lockTableFull turns SQLSTATE 53200 into a LockTableError.
func (g *Group) lockTableFull(ctx context.Context, conn *pgx.Conn, cause error) error {
	var perTx, conns, prepared int
	conn.QueryRow(ctx, `SELECT current_setting('max_locks_per_transaction')::int, current_setting('max_connections')::int,
  current_setting('max_prepared_transactions')::int`).Scan(&perTx, &conns, &prepared)
	g.mu.Lock()
	k := len(g.keys)
	g.mu.Unlock()
	return g.capacityError(k, perTx, max(conns, 1), prepared, cause)
}

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
		l.TermsTable = g.cfg.Fencing.Table
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	t := &groupTerm{l: l, cancel: cancel, done: make(chan struct{}), demoted: make(chan struct{})}
	g.owned[tagOf(key)] = t
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
	t.cancel(reason)
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		if !waitUntil(t.done, time.Now().Add(g.cfg.ReleaseTimeout)) {
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
	if err == nil {
		err = leader.ErrConnectionLost
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

// assign returns the keys the member me leads when members share keys:
// rendezvous hashing with bounded loads. Every key, taken in the order of
// its own hash, goes to the member that ranks it highest among those with
// room left; each member has room for ⌊K/M⌋ keys, the first K mod M
// members (in name order) for one more. A held key (resigned by a member)
// goes elsewhere first, past the bound when needed, so that a resign moves
// one key only.
func assign(keys map[tagKey]leader.Key, members []string, holds map[tagKey]resignHold, me string) map[tagKey]bool {
	mine := map[tagKey]bool{}
	if len(members) == 0 || !slices.Contains(members, me) {
		return mine
	}
	order := make([]tagKey, 0, len(keys))
	for k := range keys {
		order = append(order, k)
	}
	sort.Slice(order, func(i, j int) bool {
		hi, hj := keyHash(order[i]), keyHash(order[j])
		if hi != hj {
			return hi < hj
		}
		a, b := order[i], order[j]
		return a.c < b.c || a.c == b.c && (a.o < b.o || a.o == b.o && a.s < b.s)
	})
	m := len(members)
	room := make(map[string]int, m)
	for i, name := range members {
		room[name] = len(keys) / m
		if i < len(keys)%m {
			room[name]++
		}
	}
	pick := func(k tagKey, avoid string, bounded bool) {
		best, bestScore := "", uint64(0)
		for _, name := range members {
			if name == avoid || bounded && room[name] <= 0 {
				continue
			}
			if s := score(k, name); best == "" || s > bestScore {
				best, bestScore = name, s
			}
		}
		if best == "" {
			return
		}
		if avoid != "" {
			// A resigned key counts against the member that resigned it,
			// so that no other key moves to make up for it.
			room[avoid]--
		} else {
			room[best]--
		}
		if best == me {
			mine[k] = true
		}
	}
	var rest []tagKey
	for _, k := range order {
		if h, ok := holds[k]; ok && m > 1 && slices.Contains(members, h.member) {
			pick(k, h.member, false)
			continue
		}
		rest = append(rest, k)
	}
	for _, k := range rest {
		pick(k, "", true)
	}
	return mine
}

func keyHash(k tagKey) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d.%d.%d", k.c, k.o, k.s)
	return h.Sum64()
}

func score(k tagKey, member string) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d.%d.%d|%s", k.c, k.o, k.s, member)
	// fnv's low bits mix poorly for similar inputs: finish with a
	// multiply-xorshift.
	x := h.Sum64()
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	return x
}
