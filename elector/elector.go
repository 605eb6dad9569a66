// Package elector runs a long-lived leader election on a PostgreSQL advisory
// lock. An Elector owns one dedicated connection, campaigns for the lock,
// checks on every renew that its own backend still holds it, and calls
// OnElected and OnDemoted. See the README for the guarantees and the
// failure model.
package elector

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/pgleader/pgleader/internal/lockconn"
	"github.com/pgleader/pgleader/internal/terms"
	"github.com/pgleader/pgleader/leader"
)

// ErrAlreadyRunning is returned by Run when the Elector has run before.
// An Elector runs once; make a new one to run again.
var ErrAlreadyRunning = errors.New("elector: Run called more than once")

// Elector campaigns for one advisory lock and runs callbacks while it holds
// it. Create it with New and start it with Run. Its methods are safe for
// concurrent use.
type Elector struct {
	cfg   Config
	log   *zap.Logger
	obs   leader.Observer
	epoch time.Time

	tag        lockconn.Tag
	holderSQL  string
	acquireSQL string
	checkSQL   string
	bumpSQL    string // "" without fencing
	bumpArgs   []any

	ran     atomic.Bool
	leading atomic.Bool
	// OnNewLeader runs on its own goroutine: setLeader stores the latest
	// identity here and pokes newLeader.
	pendingLeader atomic.Pointer[string]
	newLeader     chan struct{}
	trustUntil    atomic.Int64 // ns since epoch; IsLeader is false past it
	leaderID      atomic.Pointer[string]

	mu     sync.Mutex
	tenure *tenure
	cbDone chan struct{} // closed when the last OnElected returned
	st     Status        // guarded by mu; see Status
}

// Status is a snapshot of an elector's state, for probes and status pages.
type Status struct {
	// Identity and Key are the elector's own.
	Identity string
	Key      leader.Key
	// Leading is IsLeader(): the lock is held and the trust window is open.
	Leading bool
	// Tenure is true from the election until the demotion begins, even when
	// the trust window has passed: a leader that believes it leads.
	Tenure bool
	// Leader is Leader(): the current leader's identity as last seen.
	Leader string
	// Term is the current tenure's fencing term (0 without fencing or when
	// not leading).
	Term int64
	// Since is when the current tenure began (zero when not leading).
	Since time.Time
	// Connected reports whether the elector has a working session.
	Connected bool
	// LastRenew is when the last successful renew (or the election) was
	// sent; zero before the first election.
	LastRenew time.Time
	// LastRound is when the elector last finished a step of its loop: a
	// campaign round, a renew, or a connection attempt. Liveness probes
	// watch it.
	LastRound time.Time
	// LastError is the last connection error or demotion reason ("" when
	// none since the last success).
	LastError string
	// RenewInterval, RenewDeadline, LeaseDuration and ReleaseTimeout are
	// the elector's settings, for probes.
	RenewInterval, RenewDeadline, LeaseDuration, ReleaseTimeout time.Duration
}

// Status returns a snapshot of the elector's state.
func (e *Elector) Status() Status {
	e.mu.Lock()
	st := e.st
	e.mu.Unlock()
	st.Leading = e.IsLeader()
	st.Tenure = e.leading.Load()
	st.Leader = e.Leader()
	if !st.Tenure {
		st.Term, st.Since = 0, time.Time{}
	}
	return st
}

// note updates the status under the lock.
func (e *Elector) note(f func(st *Status)) {
	e.mu.Lock()
	f(&e.st)
	e.mu.Unlock()
}

// tenure is one term of leadership, from the election to OnDemoted.
type tenure struct {
	l       leader.Leadership
	ctx     context.Context // OnElected's; cancelled when the step-down begins
	cancel  context.CancelCauseFunc
	cbDone  chan struct{} // closed when OnElected returned
	demoted chan struct{} // closed after OnDemoted
	lastOK  time.Time     // when the last successful check was sent
	log     *zap.Logger
}

// tenureKey marks OnElected's context with its tenure.
type tenureKey struct{}

// New validates cfg, fills in defaults and returns an Elector. A bad config
// gives a *ConfigError naming the field and the rule (errors.Is
// ErrInvalidConfig).
func New(cfg Config) (*Elector, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	e := &Elector{cfg: cfg, epoch: time.Now()}
	e.log = cfg.Logger.With(zap.Stringer("key", cfg.Key), zap.String("identity", cfg.Identity))
	e.tag = lockconn.TagOf(cfg.Key)
	e.holderSQL = e.tag.HolderSQL()
	e.acquireSQL = e.tag.AcquireSQL("pg_advisory_lock")
	e.checkSQL = e.tag.CheckSQL()
	classid, objid, objsubid := cfg.Key.LockTag()
	if cfg.Fencing.Enabled {
		q, _ := terms.Quote(cfg.Fencing.Table)
		e.bumpSQL = terms.BumpSQL(q)
		e.bumpArgs = []any{classid, objid, objsubid, cfg.Key.String(), cfg.Identity}
	}
	empty := ""
	e.leaderID.Store(&empty)
	e.pendingLeader.Store(&empty)
	e.newLeader = make(chan struct{}, 1)
	e.obs = cfg.Observer
	e.st = Status{Identity: cfg.Identity, Key: cfg.Key, LastRound: time.Now(),
		RenewInterval: cfg.RenewInterval, RenewDeadline: cfg.RenewDeadline,
		LeaseDuration: cfg.LeaseDuration, ReleaseTimeout: cfg.ReleaseTimeout}
	return e, nil
}

// Identity returns the elector's identity (its application_name).
func (e *Elector) Identity() string { return e.cfg.Identity }

// Key returns the elector's key.
func (e *Elector) Key() leader.Key { return e.cfg.Key }

// IsLeader reports whether this elector leads: it holds the lock and its
// last successful renew was sent less than RenewDeadline ago. It turns false
// on this process's clock even when the elector's goroutine cannot run.
func (e *Elector) IsLeader() bool {
	return e.leading.Load() && e.now() < e.trustUntil.Load()
}

// Leader returns the identity of the current leader as last seen: this
// elector's own while it leads, otherwise the holder seen in the latest
// campaign round, or "" when unknown.
func (e *Elector) Leader() string { return *e.leaderID.Load() }

// Leadership returns the current tenure and true while this elector leads.
func (e *Elector) Leadership() (leader.Leadership, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.tenure == nil || !e.IsLeader() {
		return leader.Leadership{}, false
	}
	return e.tenure.l, true
}

// Resign steps down now if this elector leads: it cancels the OnElected
// context, waits for OnElected to return while it keeps renewing the lock
// (bounded by ReleaseTimeout), releases the lock so that a waiting
// candidate takes over at once, and calls OnDemoted with
// leader.ErrResigned. It returns when all of that is done, or when ctx
// ends. It returns leader.ErrNotLeader when there is nothing to resign. The
// elector campaigns again after one RenewInterval.
//
// From inside OnElected, pass OnElected's own context (or one derived from
// it): Resign then starts the step-down and returns nil at once, and the
// rest happens when OnElected returns. (Returning from OnElected resigns as
// well.) With another context it would wait for OnElected, which is
// waiting for it, until ReleaseTimeout.
func (e *Elector) Resign(ctx context.Context) error {
	e.mu.Lock()
	t := e.tenure
	e.mu.Unlock()
	own, fromCallback := ctx.Value(tenureKey{}).(*tenure)
	if t == nil || (fromCallback && own != t) {
		return leader.ErrNotLeader // no tenure, or a past tenure's callback
	}
	t.cancel(leader.ErrResigned)
	if fromCallback {
		return nil
	}
	select {
	case <-t.demoted:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (e *Elector) now() int64 { return int64(time.Since(e.epoch)) }

func (e *Elector) setLeader(id string) {
	if *e.leaderID.Load() == id {
		return
	}
	e.leaderID.Store(&id)
	if id == "" {
		return
	}
	e.log.Info("new leader seen", zap.String("leader", id))
	if e.cfg.Callbacks.OnNewLeader != nil {
		e.pendingLeader.Store(&id)
		select {
		case e.newLeader <- struct{}{}:
		default: // a report is pending; it will carry the latest identity
		}
	}
}

// reportLeaders calls OnNewLeader off the elector's goroutine, in order,
// coalescing: a slow callback is next called with the latest leader, not
// with every one in between. It returns when stop closes.
func (e *Elector) reportLeaders(stop <-chan struct{}) {
	last := ""
	for {
		select {
		case <-stop:
			return
		case <-e.newLeader:
			if id := *e.pendingLeader.Load(); id != last {
				last = id
				e.cfg.Callbacks.OnNewLeader(id)
			}
		}
	}
}

// Run campaigns for the lock, leads while it holds it, and campaigns again
// after each demotion, reconnecting as needed, until ctx ends. It then
// steps down gracefully (see Resign), closes its connection, waits for every
// goroutine it started, and returns nil.
//
// Run returns an error only for problems retrying cannot fix, at once and
// logged at error level:
//   - leader.ErrTransactionPooling: the connection goes through a
//     transaction-pooling proxy;
//   - leader.ErrNoTermsTable: with fencing, the terms table is missing (and
//     NoCreate is set) or the role lacks a privilege on it (SQLSTATE 42501);
//   - leader.ErrReadOnly: with fencing, the database is read-only for this
//     role (25006);
//   - leader.ErrRejected: a DSN connector's login was refused (28P01,
//     28000) or its database does not exist (3D000);
//   - ErrAlreadyRunning, when called a second time.
//
// The server's *pgconn.PgError stays in the chain (errors.As). Everything
// else is retried with a jittered exponential backoff capped at
// ReconnectMaxDelay (the backoff resets only after a session that lasted
// LeaseDuration, so a server that accepts and then drops every session
// does not cause a tight loop): connection failures, restarts, too many
// connections, a custom Connector's errors (it may fetch fresh credentials
// each time), and leader.ErrStandby, which is logged at error level on
// every attempt and retried no faster than every RenewInterval, since a
// standby may be promoted and a multi-host DSN finds the new primary.
// Status().LastError shows the latest error meanwhile.
func (e *Elector) Run(ctx context.Context) error {
	if !e.ran.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer e.waitCallback(context.Background()) // for good: Run returns after OnElected
	if e.cfg.Callbacks.OnNewLeader != nil {
		stop, stopped := make(chan struct{}), make(chan struct{})
		go func() { defer close(stopped); e.reportLeaders(stop) }()
		defer func() { close(stop); <-stopped }()
	}
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 25 * time.Millisecond
	bo.MaxInterval = e.cfg.ReconnectMaxDelay
	bo.Multiplier = 2
	bo.RandomizationFactor = 0.5
	bo.MaxElapsedTime = 0
	bo.Reset()
	attempt := 0
	for {
		served, err := e.connectAndServe(ctx)
		if served > e.cfg.LeaseDuration {
			// A session that lasted resets the backoff; one that breaks
			// right after it was set up (a crash loop) does not.
			attempt = 0
			bo.Reset()
		}
		if ctx.Err() != nil {
			return nil
		}
		e.note(func(st *Status) { st.Connected, st.LastRound, st.LastError = false, time.Now(), err.Error() })
		if Permanent(err) {
			e.log.Error("giving up: retrying cannot fix this", zap.Error(err))
			return err
		}
		attempt++
		delay := bo.NextBackOff()
		if errors.Is(err, leader.ErrStandby) {
			delay = max(delay, e.cfg.RenewInterval)
			e.log.Error("connected to a standby; reconnecting", zap.Int("attempt", attempt), zap.Duration("delay", delay), zap.Error(err))
		} else {
			e.log.Warn("reconnecting", zap.Int("attempt", attempt), zap.Duration("delay", delay), zap.Error(err))
		}
		e.obs.Reconnecting(e.cfg.Key, e.cfg.Identity, attempt, delay, err)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// Permanent reports whether Run gives up on err rather than retrying: see
// Run for the list.
func Permanent(err error) bool {
	for _, p := range []error{leader.ErrTransactionPooling, leader.ErrNoTermsTable, leader.ErrReadOnly, leader.ErrRejected} {
		if errors.Is(err, p) {
			return true
		}
	}
	return false
}

// connectAndServe opens a connection, campaigns and leads on it until it
// breaks or ctx ends, and closes it. It reports how long the session served.
func (e *Elector) connectAndServe(ctx context.Context) (time.Duration, error) {
	cctx, cancel := context.WithTimeout(ctx, e.cfg.LeaseDuration)
	conn, err := e.cfg.Connect.Connect(cctx)
	cancel()
	if err != nil {
		return 0, fmt.Errorf("connect: %w", err)
	}
	defer lockconn.Close(conn)
	// The setup statements are bounded like the connection attempt.
	sctx, cancel := context.WithTimeout(ctx, e.cfg.LeaseDuration)
	defer cancel()
	sess, err := e.setup(sctx, conn)
	if err != nil {
		return 0, fmt.Errorf("session setup: %w", err)
	}
	if f := e.cfg.Fencing; f.Enabled {
		if err := terms.Ensure(sctx, conn, f.Table, !f.NoCreate); err != nil {
			return 0, fmt.Errorf("fencing: %w", err)
		}
	}
	cancel()
	e.log.Info("connected", zap.Uint32("backend_pid", sess.PID))
	e.note(func(st *Status) { st.Connected, st.LastRound, st.LastError = true, time.Now(), "" })
	began := time.Now()
	err = e.serve(ctx, conn, sess)
	return time.Since(began), err
}

// setup configures the session in one round trip: application_name, the
// lock wait bound, the server-side lease and keepalives.
func (e *Elector) setup(ctx context.Context, conn *pgx.Conn) (lockconn.Session, error) {
	c := e.cfg
	sess, err := lockconn.Setup(ctx, conn, lockconn.Settings{
		Identity: c.Identity, LockTimeout: c.RenewInterval, Lease: c.LeaseDuration,
		KeepIdle: c.RenewDeadline, SyncCommit: true, // a fencing term must survive a crash and a failover
	})
	if err == nil && sess.Major < 14 {
		e.log.Warn("PostgreSQL before 14 has no idle_session_timeout: a paused or partitioned leader keeps the lock on the server until TCP keepalives end its session, and a paused process answers keepalives",
			zap.Int("server_major", sess.Major))
	}
	return sess, err
}

// serve alternates campaigns and tenures on one connection.
func (e *Elector) serve(ctx context.Context, conn *pgx.Conn, sess lockconn.Session) error {
	coolDown, possiblyHeld := false, false
	var campaignStart time.Time
	for {
		if err := e.waitCallback(ctx); err != nil {
			return err
		}
		if coolDown {
			// Give a waiting candidate the lock we just released.
			coolDown = false
			t := time.NewTimer(e.cfg.RenewInterval)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
		}
		if campaignStart.IsZero() {
			campaignStart = time.Now()
			e.log.Info("campaigning")
			e.obs.Campaigning(e.cfg.Key, e.cfg.Identity)
		}
		won, sent, err := e.campaign(ctx, conn, sess, &possiblyHeld)
		if err != nil {
			return err
		}
		e.note(func(st *Status) { st.LastRound = time.Now() })
		if !won {
			continue
		}
		e.obs.LockWaited(e.cfg.Key, time.Since(campaignStart), true)
		campaignStart = time.Time{}
		reason, keepConn := e.lead(ctx, conn, sess, sent)
		if !keepConn {
			return reason
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		coolDown = true
	}
}

// campaign runs one campaign round: it looks up the holder, then waits for
// the lock for at most RenewInterval (lock_timeout). Both statements go in
// one pipelined round trip. The acquisition never stacks on a lock the
// backend already holds.
//
// A wait can end in lock_timeout at the very moment the lock is granted;
// PostgreSQL then reports the timeout and the session keeps the lock. So
// after a timed-out round the lock is "possibly held", and the next round,
// finding it held by this backend, takes it as won.
//
// The round has a client-side deadline: its lock wait plus RenewDeadline.
// A proxy that keeps the socket open but forwards nothing ends the round
// there with ErrConnectionLost, and Run reconnects.
func (e *Elector) campaign(ctx context.Context, conn *pgx.Conn, sess lockconn.Session, possiblyHeld *bool) (won bool, sent time.Time, err error) {
	b := &pgx.Batch{}
	b.Queue(e.holderSQL)
	b.Queue(e.acquireSQL, e.tag.Vals...)
	sent = time.Now()
	ctx, cancel := context.WithDeadline(ctx, sent.Add(e.cfg.RenewInterval+e.cfg.RenewDeadline))
	defer cancel()
	defer func() {
		if err != nil && ctx.Err() == context.DeadlineExceeded && !errors.Is(err, leader.ErrConnectionLost) {
			err = fmt.Errorf("%w: no answer to a campaign round within its lock wait plus RenewDeadline (%s): %w",
				leader.ErrConnectionLost, e.cfg.RenewInterval+e.cfg.RenewDeadline, err)
		}
	}()
	br := conn.SendBatch(ctx, b)
	defer br.Close()
	var holder string
	var holderPid, ownPid int32
	switch err := br.QueryRow().Scan(&holder, &holderPid, &ownPid); {
	case errors.Is(err, pgx.ErrNoRows):
		empty := ""
		e.leaderID.Store(&empty) // nobody leads; no callback for that
	case err != nil:
		return false, sent, lockconn.Pooling(err)
	case holderPid != ownPid:
		if holder == "" {
			holder = "pid " + strconv.Itoa(int(holderPid))
		}
		e.setLeader(holder)
	}
	r, err := lockconn.ScanAcquire(br.QueryRow())
	if lockconn.IsLockTimeout(err) {
		e.log.Debug("lock busy; campaigning again", zap.String("holder", holder))
		br.Close() // returns the same lock timeout error
		*possiblyHeld = true
		return false, sent, nil
	}
	if err != nil {
		return false, sent, lockconn.Pooling(err)
	}
	if err := sess.Same(r.PID, r.Token); err != nil {
		return false, sent, err
	}
	if r.Already && !*possiblyHeld {
		// Our backend holds a lock this elector never took: another client
		// shares this server connection.
		return false, sent, fmt.Errorf("%w: this session's backend (pid %d) already held the lock before this elector took it", leader.ErrTransactionPooling, r.PID)
	}
	if r.Already {
		e.log.Info("the last lock wait timed out as the lock was granted; holding it")
	}
	*possiblyHeld = false
	return r.Held, sent, br.Close()
}

// errTermStuck: the lock is ours, but the next term could not be installed
// within LeaseDuration because an earlier leader's fenced transaction holds
// the term row.
var errTermStuck = errors.New("fencing term row locked by an earlier leader's transaction")

// confirm proves, right after the lock was granted, that our own backend
// holds it (which also catches a transaction-pooling proxy), and with
// fencing installs the next term in the same round trip. It returns when
// the successful check was sent, and the term.
func (e *Elector) confirm(conn *pgx.Conn, sess lockconn.Session, sent time.Time) (time.Time, int64, error) {
	giveUp := time.Now().Add(e.cfg.LeaseDuration)
	trustFrom := sent
	for {
		vsent := time.Now()
		ctx, cancel := context.WithDeadline(context.Background(), trustFrom.Add(e.cfg.RenewDeadline))
		term, err := e.checkAndBump(ctx, conn, sess)
		cancel()
		if errors.Is(err, leader.ErrLockLost) {
			err = fmt.Errorf("%w: the lock just taken is missing from pg_locks", leader.ErrTransactionPooling)
		}
		if !errors.Is(err, errTermBusy) {
			return vsent, term, err
		}
		trustFrom = vsent // the check in that round trip succeeded
		if time.Now().After(giveUp) {
			return vsent, 0, errTermStuck
		}
	}
}

var errTermBusy = errors.New("term row busy")

func (e *Elector) checkAndBump(ctx context.Context, conn *pgx.Conn, sess lockconn.Session) (int64, error) {
	if e.bumpSQL == "" {
		return 0, lockconn.Check(ctx, conn, e.tag, sess)
	}
	b := &pgx.Batch{}
	b.Queue(e.checkSQL)
	b.Queue(e.bumpSQL, e.bumpArgs...)
	br := conn.SendBatch(ctx, b)
	defer br.Close()
	if err := lockconn.CheckResult(br.QueryRow(), sess); err != nil {
		return 0, err
	}
	var term int64
	err := br.QueryRow().Scan(&term)
	var pgErr *pgconn.PgError
	switch {
	case lockconn.IsLockTimeout(err):
		br.Close()
		return 0, errTermBusy
	case errors.As(err, &pgErr):
		return 0, fmt.Errorf("install term: %w", terms.Classify(err, e.cfg.Fencing.Table))
	case err != nil:
		return 0, fmt.Errorf("%w: install term: %w", leader.ErrConnectionLost, err)
	}
	return term, br.Close()
}

// lead runs one tenure, from the lock being granted to the demotion:
// begin, hold, step down. It reports the reason, and whether the connection
// is still fit for use.
func (e *Elector) lead(ctx context.Context, conn *pgx.Conn, sess lockconn.Session, sent time.Time) (reason error, keepConn bool) {
	vsent, term, err := e.confirm(conn, sess, sent)
	if errors.Is(err, errTermStuck) {
		e.log.Error("could not install the next fencing term: a transaction of an earlier leader holds the term row; releasing the lock and campaigning again. Set idle_in_transaction_session_timeout on the connections that call Fence.",
			zap.String("table", e.cfg.Fencing.Table))
		return err, e.unlock(conn) == nil
	}
	if err != nil {
		return err, false
	}
	t := e.begin(ctx, sess, term, vsent, sent)
	reason = e.hold(t, conn, sess)
	return e.stepDown(ctx, conn, sess, t, reason)
}

// begin starts a tenure: it opens the trust window, starts OnElected, and
// only then reports the election (log, Observer, OnNewLeader), so that
// nothing of the user's runs between the lock check and OnElected.
func (e *Elector) begin(ctx context.Context, sess lockconn.Session, term int64, vsent, campaignSent time.Time) *tenure {
	c := e.cfg
	l := leader.Leadership{Key: c.Key, Identity: c.Identity, Term: term, ElectedAt: time.Now(), BackendPID: sess.PID}
	if c.Fencing.Enabled {
		l.TermsTable = c.Fencing.Table
	}
	t := &tenure{l: l, demoted: make(chan struct{}), cbDone: make(chan struct{}), lastOK: vsent}
	// The marker lets Resign know a call made with OnElected's own context.
	leadCtx, cancel := context.WithCancelCause(context.WithValue(ctx, tenureKey{}, t))
	t.ctx, t.cancel = leadCtx, cancel
	t.log = e.log.With(zap.Int64("term", term), zap.Uint32("backend_pid", sess.PID))
	e.trustUntil.Store(int64(vsent.Sub(e.epoch) + c.RenewDeadline))
	e.leading.Store(true)
	e.mu.Lock()
	e.tenure, e.cbDone = t, t.cbDone
	e.mu.Unlock()
	go func() {
		defer close(t.cbDone)
		defer cancel(leader.ErrCallbackReturned)
		c.Callbacks.OnElected(leadCtx, l)
	}()
	e.note(func(st *Status) {
		st.Term, st.Since, st.LastRenew, st.LastRound, st.LastError = term, l.ElectedAt, vsent, time.Now(), ""
	})
	t.log.Info("elected", zap.Duration("acquire_wait", l.ElectedAt.Sub(campaignSent)))
	e.obs.Elected(l)
	e.setLeader(c.Identity)
	return t
}

// hold keeps the tenure: it renews on the RenewInterval schedule and reads
// the idle socket in between, so that a terminated backend's FATAL message
// or EOF ends the tenure at once. It returns the reason the tenure ends:
// the cause of OnElected's context (a resign, OnElected returning, Run's
// context) or a fault.
func (e *Elector) hold(t *tenure, conn *pgx.Conn, sess lockconn.Session) error {
	for {
		werr := lockconn.WaitIdle(t.ctx, conn, t.lastOK.Add(e.cfg.RenewInterval))
		switch {
		case t.ctx.Err() != nil:
			return context.Cause(t.ctx)
		case werr != nil:
			return werr
		}
		if err := e.renew(t, conn, sess, true); err != nil {
			return err
		}
	}
}

// renew proves that this session's backend still holds the lock. The check
// must answer within the trust window, RenewDeadline from when the last
// successful renew was sent; a successful one moves the window to its own
// send time. While leading (not draining) it also extends IsLeader.
func (e *Elector) renew(t *tenure, conn *pgx.Conn, sess lockconn.Session, leading bool) error {
	rsent := time.Now()
	rctx, cancel := context.WithDeadline(context.Background(), t.lastOK.Add(e.cfg.RenewDeadline))
	err := lockconn.Check(rctx, conn, e.tag, sess)
	cancel()
	if err != nil {
		return err
	}
	t.lastOK = rsent
	if leading {
		e.trustUntil.Store(int64(rsent.Sub(e.epoch) + e.cfg.RenewDeadline))
	}
	latency := time.Since(rsent)
	e.note(func(st *Status) { st.LastRenew, st.LastRound = rsent, time.Now() })
	e.obs.Renewed(t.l, latency)
	t.log.Debug("renewed", zap.Duration("latency", latency), zap.Bool("draining", !leading))
	return nil
}

// errReleaseTimeout: OnElected did not return within ReleaseTimeout.
var errReleaseTimeout = errors.New("OnElected did not return within ReleaseTimeout")

// stepDown ends a tenure: stop trusting, cancel OnElected, then either
// drain (a graceful step-down: keep the lock, renewed, until OnElected
// returns) and unlock, or (a fault: the lock is gone or in doubt) close the
// session at once and wait for OnElected. OnDemoted comes last.
func (e *Elector) stepDown(ctx context.Context, conn *pgx.Conn, sess lockconn.Session, t *tenure, reason error) (error, bool) {
	c := e.cfg
	releaseAt := time.Now().Add(c.ReleaseTimeout)
	e.leading.Store(false)
	e.trustUntil.Store(0)
	t.cancel(reason)
	e.obs.Demoted(t.l, reason)
	graceful := errors.Is(reason, leader.ErrResigned) || errors.Is(reason, leader.ErrCallbackReturned) || ctx.Err() != nil
	keepConn := false
	if graceful {
		t.log.Info("stepping down: waiting for OnElected to return, renewing meanwhile", zap.NamedError("reason", reason))
		switch fault := e.drain(t, conn, sess, releaseAt); {
		case fault == nil:
			keepConn = e.unlock(conn) == nil
		case errors.Is(fault, errReleaseTimeout):
			t.log.Error("OnElected did not return within ReleaseTimeout after its context was cancelled; releasing the lock while it still runs, so two leaders may act at once",
				zap.Duration("release_timeout", c.ReleaseTimeout))
			keepConn = e.unlock(conn) == nil
		default:
			t.log.Error("the lock was lost while OnElected was returning; another leader may act before it returns",
				zap.NamedError("resign_reason", reason), zap.Error(fault))
			reason = fault
			graceful = false
		}
	}
	if !graceful {
		lockconn.Close(conn) // the lock is gone or in doubt: end the session now
		e.note(func(st *Status) { st.LastError = reason.Error() })
		t.log.Warn("stepping down", zap.NamedError("reason", reason))
		if !waitUntil(t.cbDone, releaseAt) {
			t.log.Error("OnElected did not return within ReleaseTimeout after its context was cancelled",
				zap.Duration("release_timeout", c.ReleaseTimeout))
		}
	} else if !keepConn {
		lockconn.Close(conn)
	}
	e.setLeaderIfSelf()
	t.log.Info("demoted", zap.NamedError("reason", reason))
	if c.Callbacks.OnDemoted != nil {
		c.Callbacks.OnDemoted(t.l, reason)
	}
	e.mu.Lock()
	e.tenure = nil
	e.mu.Unlock()
	close(t.demoted)
	return reason, keepConn
}

// drain keeps a stepping-down leader's session alive and its lock checked
// on the renew schedule while OnElected returns, so that the server-side
// lease never frees the lock under a callback that is still running. It
// returns nil when OnElected returned, errReleaseTimeout at releaseAt, or
// the fault that lost the lock or the connection.
func (e *Elector) drain(t *tenure, conn *pgx.Conn, sess lockconn.Session, releaseAt time.Time) error {
	dctx, cancel := context.WithDeadline(context.Background(), releaseAt)
	defer cancel()
	go func() {
		select {
		case <-t.cbDone:
			cancel()
		case <-dctx.Done():
		}
	}()
	for {
		select {
		case <-t.cbDone:
			return nil
		default:
		}
		werr := lockconn.WaitIdle(dctx, conn, t.lastOK.Add(e.cfg.RenewInterval))
		select {
		case <-t.cbDone:
			return nil
		default:
		}
		switch {
		case dctx.Err() != nil:
			return errReleaseTimeout
		case werr != nil:
			return werr
		}
		if err := e.renew(t, conn, sess, false); err != nil {
			return err
		}
	}
}

// waitUntil waits for done until the deadline; it reports whether done
// closed.
func waitUntil(done chan struct{}, deadline time.Time) bool {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

func (e *Elector) setLeaderIfSelf() {
	if e.Leader() == e.cfg.Identity {
		empty := ""
		e.leaderID.Store(&empty)
	}
}

// unlock releases the lock once. It fails when the lock was not held, which
// would mean the session state is not what the elector believes.
func (e *Elector) unlock(conn *pgx.Conn) error {
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.RenewDeadline)
	defer cancel()
	err := lockconn.Unlock(ctx, conn, e.tag)
	if err != nil {
		e.log.Warn("unlock failed; closing the connection to release the lock", zap.Error(err))
	}
	return err
}

// waitCallback waits for the last OnElected to return, logging an error
// every ReleaseTimeout, and returns ctx's error when ctx ends first.
func (e *Elector) waitCallback(ctx context.Context) error {
	e.mu.Lock()
	done := e.cbDone
	e.mu.Unlock()
	if done == nil {
		return nil
	}
	for {
		t := time.NewTimer(max(e.cfg.ReleaseTimeout, time.Second))
		select {
		case <-done:
			t.Stop()
			return nil
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
			e.log.Error("still waiting for a previous OnElected to return; it ignores its context")
		}
	}
}
