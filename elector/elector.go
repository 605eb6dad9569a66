// Package elector runs a long-lived leader election on a PostgreSQL advisory
// lock. An Elector owns one dedicated connection, campaigns for the lock,
// checks on every renew that its own backend still holds it, and calls
// OnElected and OnDemoted. The README states the guarantees and the failure
// model; docs/how-it-works.md is the design.
//
// The states, each a function of this package:
//
//	openLease --> campaign --won--> confirm --> begin --> hold (renew, WaitIdle)
//	    ^          ^     |                                   |
//	    |          +-----+ busy: next round                  v
//	    |          |                                      stepDown
//	    |          |                                     /        \
//	    |          +-- cool down <-- graceful: drain, unlock     fault
//	    |                                                          |
//	    +--------------- close, backoff, reconnect ----------------+
//
// A fault during the drain takes the fault path. Run loops over
// connectAndServe; serve over campaign and lead (confirm, begin, hold,
// stepDown).
//
// The wire work (the SQL, the pipelined round trips, the SQLSTATEs) is the
// lease's: internal/wire/lockconn.Lease, behind the small lease interface, so
// tests can script what a real server rarely does.
package elector

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/internal/wire/terms"
	"github.com/pgleader/pgleader/internal/wire/timing"
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

	target    *lockconn.Target
	roundWait atomic.Int64                             // the longest quiet follower round on this session (an heir's lock wait, a watcher's poll interval); 0 for the plain round
	open      func(ctx context.Context) (lease, error) // openLease, or a script in tests

	ran     atomic.Bool
	leading atomic.Bool
	// OnNewLeader runs on its own goroutine: setLeader stores the latest
	// identity here and pokes newLeader.
	pendingLeader atomic.Pointer[string]
	newLeader     chan struct{}
	// Values (see Config.Value): this candidate's own value, the leader's
	// as last paired, the one OnLeaderValue is to get, the backend whose
	// value was read last (the elector's goroutine only), and the
	// statements.
	value                 atomic.Pointer[[]byte]
	leaderValue           atomic.Pointer[leader.Proclamation]
	pendingValue          atomic.Pointer[leader.Proclamation]
	newValue              chan struct{}
	valuePID              int32
	proclaimSQL, valueSQL string
	trustUntil            atomic.Int64 // ns since epoch; IsLeader is false past it
	leaderID              atomic.Pointer[string]
	// leaderPID is the backend of the leader named by leaderID, as the
	// last round that read the holder saw it (0: none known). Only the
	// elector's goroutine uses it.
	leaderPID int32
	// leaderRank is the rank of the leader named by leaderID, as its
	// application_name says (the zero rank: unranked). rankTo is the
	// leader's backend this candidate last told its rank (see tellRank),
	// rankSent when, and rankGap how long until it may tell it again (the
	// elector's goroutine only).
	leaderRank leader.Rank
	rankTo     uint32
	rankSent   time.Time
	rankGap    time.Duration

	elected     chan struct{} // closed at the first election; see Elected
	electedOnce sync.Once
	done        chan struct{} // closed when Run returned; see Done
	runErr      error         // Run's error, once done is closed

	// history: this session keeps the history table (Run's goroutine
	// only, as are pendingDemotion, a term's end not yet recorded, and the
	// tables as the session found them).
	history                  bool
	pendingDemotion          *demotion
	termsTable, historyTable terms.Table

	requests requests // resign requests taken up, refused, dropped

	mu     sync.Mutex
	tenure *tenure
	cbDone chan struct{} // closed when the last OnElected returned
	st     Status        // guarded by mu; see Status
}

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
	bump := ""
	if cfg.Fencing.Enabled {
		q, _ := terms.Quote(cfg.Fencing.Table)
		bump = terms.BumpSQL(q)
	}
	e.target = lockconn.NewTarget(cfg.Key, bump, cfg.Key.String(), cfg.Identity)
	e.open = e.openLease
	empty := ""
	e.leaderID.Store(&empty)
	e.pendingLeader.Store(&empty)
	e.newLeader, e.newValue = make(chan struct{}, 1), make(chan struct{}, 1)
	if cfg.Value != nil {
		v := append([]byte{}, cfg.Value...)
		e.value.Store(&v)
	}
	if cfg.Values.Enabled {
		e.target.WatchValues()
	}
	e.elected, e.done = make(chan struct{}), make(chan struct{})
	e.obs = cfg.Observer
	e.st = Status{Identity: cfg.Identity, Key: cfg.Key, LastRound: time.Now(),
		RenewInterval: cfg.RenewInterval, RenewDeadline: cfg.RenewDeadline,
		LeaseDuration: cfg.LeaseDuration, ReleaseTimeout: cfg.ReleaseTimeout,
		Priority: cfg.Priority, Version: cfg.Version, Strategy: cfg.Strategy}
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
	// Stop trusting and cancel OnElected's context here rather than wait
	// for the elector's loop to notice (it is reading the idle socket):
	// the callback then returns while the loop wakes, which shortens a
	// handover. stepDown does the same again, and the first cause stays.
	// The stop signal goes first: a callback that returns at once would
	// otherwise set its own cause (ErrCallbackReturned) before ours.
	e.leading.Store(false)
	e.trustUntil.Store(0)
	t.stopWith(leader.ErrResigned)
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

// Elected returns a channel that is closed the first time this elector is
// elected, once OnElected has started: what a main that must not go on
// before it leads waits for (controller-runtime's Elected(); etcd's
// blocking Campaign is <-e.Elected() after go e.Run(ctx)). It stays closed
// after a demotion; IsLeader tells the present.
func (e *Elector) Elected() <-chan struct{} { return e.elected }

// Done returns a channel that is closed when Run has returned: with Err,
// what a program that waits on Elected also selects on, so that an error
// Run gives up on (a wrong password, a transaction pooler) does not leave
// it waiting for ever. WaitElected does both.
func (e *Elector) Done() <-chan struct{} { return e.done }

// Err returns Run's error once Done is closed, and nil before.
func (e *Elector) Err() error {
	select {
	case <-e.done:
		return e.runErr
	default:
		return nil
	}
}

// WaitElected waits until this elector is first elected (OnElected has
// started) and returns nil. When Run returns first it returns Run's error,
// or an error matching leader.ErrNotLeader when Run stopped because its
// context ended; when ctx ends first, ctx's error.
//
//	go e.Run(ctx)
//	if err := e.WaitElected(ctx); err != nil {
//		log.Fatal(err) // the server's message: a wrong password, no such database, ...
//	}
func (e *Elector) WaitElected(ctx context.Context) error {
	select {
	case <-e.elected:
		return nil
	case <-e.done:
		select {
		case <-e.elected: // elected, then stopped
			return nil
		default:
		}
		if e.runErr != nil {
			return e.runErr
		}
		return fmt.Errorf("%w: Run returned before the first election", leader.ErrNotLeader)
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (e *Elector) now() int64 { return int64(time.Since(e.epoch)) }

// setLeader records the leader a round saw, by its session's
// application_name: its identity, and its rank when it has one.
func (e *Elector) setLeader(app string) {
	if id, changed := e.storeLeader(app); changed {
		e.reportLeader(id)
	}
}

// storeLeader is setLeader's first half: Leader() (and, with values on,
// LeaderValue()) name app's identity from now on. It reports whether that
// identity is new and not "".
func (e *Elector) storeLeader(app string) (id string, changed bool) {
	id, r, _ := leader.ParseApplicationName(app)
	e.leaderRank = r
	if *e.leaderID.Load() == id {
		return id, false
	}
	e.leaderID.Store(&id)
	if id == "" {
		return id, false
	}
	if e.cfg.Values.Enabled {
		e.setLeaderValue(leader.Proclamation{Identity: id}) // its value once read
	}
	return id, true
}

// reportLeader is setLeader's second half, for a new leader id: the log
// line and OnNewLeader. A new tenure calls it once OnElected has started
// (begin), so that neither delays the leader's work.
func (e *Elector) reportLeader(id string) {
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
//   - leader.ErrUnsupportedServer: the server is older than PostgreSQL 14;
//   - leader.ErrForeignTable: with fencing, the terms or history table
//     belongs to a role the elector's role is not a member of;
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
func (e *Elector) Run(ctx context.Context) (err error) {
	if !e.ran.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer func() { e.runErr = err; close(e.done) }()
	defer e.waitCallback(context.Background()) // for good: Run returns after OnElected
	if e.cfg.Callbacks.OnNewLeader != nil {
		stop, stopped := make(chan struct{}), make(chan struct{})
		go func() { defer close(stopped); e.reportLeaders(stop) }()
		defer func() { close(stop); <-stopped }()
	}
	if e.cfg.Callbacks.OnLeaderValue != nil {
		stop, stopped := make(chan struct{}), make(chan struct{})
		go func() { defer close(stopped); e.reportValues(stop) }()
		defer func() { close(stop); <-stopped }()
	}
	r := timing.NewRetry(e.cfg.durations())
	for {
		served, err := e.connectAndServe(ctx)
		if ctx.Err() != nil {
			return nil
		}
		e.note(func(st *Status) { st.Connected, st.LastRound, st.LastError = false, time.Now(), err.Error() })
		if Permanent(err) {
			e.log.Error("giving up: retrying cannot fix this", zap.Error(err))
			return err
		}
		attempt, delay := r.Next(served, err)
		r.Log(e.log, attempt, delay, err)
		e.obs.Reconnecting(e.cfg.Key, e.cfg.Identity, attempt, delay, err)
		if !timing.Sleep(ctx, delay) {
			return nil
		}
	}
}

// Permanent reports whether Run gives up on err rather than retrying: see
// Run for the list.
func Permanent(err error) bool { return timing.Permanent(err) }
