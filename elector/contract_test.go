package elector_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/leader"
)

// Tests of the timing contract that a loopback server hides: they slow or
// cut the path at chosen moments.

// renewTrap black-holes a proxy right after the first successful renew
// once armed, and records when.
type renewTrap struct {
	leader.NopObserver
	proxy *testpg.Proxy
	armed atomic.Bool
	fired atomic.Bool // the path went silent
	once  sync.Once
	at    chan time.Time
}

func (o *renewTrap) Renewed(leader.Leadership, time.Duration) {
	if o.armed.Load() {
		o.once.Do(func() {
			o.proxy.Blackhole()
			o.fired.Store(true)
			o.at <- time.Now()
		})
	}
}

// blackholeAfterRenew runs a leader behind a proxy (with replies delayed by
// delay once elected), black-holes its path right after a renew succeeds,
// and returns how long after that the leader stepped down.
func blackholeAfterRenew(t *testing.T, interval, deadline, lease, delay time.Duration) time.Duration {
	t.Helper()
	srv := sharedServer(t)
	r := newRecorder(t)
	proxy := newProxy(t, srv)
	trap := &renewTrap{proxy: proxy, at: make(chan time.Time, 1)}
	stepped := make(chan time.Time, 1)
	startWith(t, r, opts{dsn: proxy.DSN(), key: testKey(t), id: "trapped", lease: lease, deadline: deadline,
		onLead: func(ctx context.Context, l leader.Leadership) {
			<-ctx.Done()
			// Only the tenure the trap ended: on a loaded machine an
			// earlier delayed renew may miss its window, and the elector
			// is elected again before a renew succeeds.
			if trap.fired.Load() {
				select {
				case stepped <- time.Now():
				default:
				}
			}
		}}, func(c *elector.Config) { c.Observer, c.RenewInterval = trap, interval })
	r.next("elected", "trapped")
	proxy.DelayReplies(delay)
	trap.armed.Store(true)
	holed := recv(t, trap.at, "a renew after arming")
	defer proxy.Heal()
	return recv(t, stepped, "the step-down").Sub(holed)
}

// The trust window counts from when the last successful renew was *sent*.
// With replies 400 ms late, that renew was sent 400 ms before the path went
// silent, so the leader must step down about RenewDeadline - 400 ms after
// (800 ms), not RenewDeadline after (1.2 s), which counting from the reply
// would give. The delay is under half the deadline, so that an elector
// that missed a window on a loaded machine (a renew 400 ms late plus a
// stall) can be elected again with renews that fit: its first renew's
// window opens when its confirm was sent, a delay before the renew is.
func TestTrustWindowCountsFromSend(t *testing.T) {
	const deadline, delay = 1200 * time.Millisecond, 400 * time.Millisecond
	took := blackholeAfterRenew(t, 100*time.Millisecond, deadline, 3*time.Second, delay)
	t.Logf("stepped down %s after the path went silent (window from the send: %s)", took, deadline-delay)
	if took > deadline-delay+200*time.Millisecond {
		t.Fatalf("stepped down %s after the last renew's reply; the window from its send closed at %s", took, deadline-delay)
	}
}

// The renew deadline counts from the last *successful* renew, not from the
// renew in flight: with a 400 ms interval, a path that goes silent right
// after a renew must end the tenure RenewDeadline (600 ms) later, not an
// interval later still (1 s).
func TestRenewDeadlineFromLastSuccess(t *testing.T) {
	const interval, deadline = 400 * time.Millisecond, 600 * time.Millisecond
	took := blackholeAfterRenew(t, interval, deadline, 2*time.Second, 0)
	t.Logf("stepped down %s after the path went silent (RenewDeadline %s)", took, deadline)
	if took > deadline+200*time.Millisecond {
		t.Fatalf("stepped down %s after the last successful renew; RenewDeadline is %s", took, deadline)
	}
}

// A leader whose server answers late (its session alive, a renew not
// answered within the trust window) stops trusting the lock when the
// window closes and cancels OnElected, but keeps its session, and so the
// lock, until OnElected has returned: closing it at once would let the
// waiting candidate lead while the old leader's OnElected still works
// (here for two seconds after its context's end). The late answer comes
// during the drain: the leader then drains as for a resign (renewing,
// then unlocking), and must not close the session first.
func TestLateRenewKeepsLockWhileDraining(t *testing.T) {
	r, _ := startSlowDrainer(t, 2*time.Second, "")
	nextAfterSlowReturned(t, r)
	endedForTheWindow(t, r)
}

// The leader's other statements are bounded by the same trust window,
// with the same rule at its end: the session stays open until OnElected
// returned. Each case slows the path just as that statement goes out, so
// that it is the one the window's end finds unanswered (a Proclaim's
// write; the look-up of a ranked candidate's session, the readying of
// the handover to it and the reservation for it; a resign request's
// look-up of who asked). OnElected drains for four seconds: a statement's
// first use is two slowed round trips, and a resign request's answer two
// more, all of which must come back while OnElected still runs.
func TestLateStatementKeepsLockWhileDraining(t *testing.T) {
	none := func(*testing.T, leader.Key, *running, string) {}
	for _, tc := range []struct {
		name, method string
		noAhead      bool // the reservation at the handover's due time, not ahead of it
		act          func(t *testing.T, key leader.Key, slow *running, dsn string)
	}{
		{"Proclaim", "Proclaim", false, func(t *testing.T, _ leader.Key, slow *running, _ string) {
			// The write answers late: the leader is not leading by then.
			if err := slow.e.Proclaim(context.Background(), []byte("v2")); !errors.Is(err, leader.ErrNotLeader) {
				t.Errorf("Proclaim whose write answered after the window: %v, want ErrNotLeader", err)
			}
		}},
		// next ranks above slow: slow proves it, readies the handover to
		// it, and reserves the lock for it (ahead, or at the due time).
		{"Candidate", "Candidate", false, none},
		{"Precede", "Precede", false, none},
		{"ReserveAhead", "Reserve", false, none},
		{"ReserveAtHandover", "Reserve", true, none},
		{"Requester", "Requester", false, func(t *testing.T, key leader.Key, _ *running, dsn string) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			// Its answer may come, or not: only the lock's fate is checked.
			_, _ = elector.RequestResign(ctx, elector.DSN(dsn), key, "")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.noAhead {
				// Runs first, alone: the others wait for the loop's end.
				defer elector.SetReserveAhead(elector.SetReserveAhead(0))
			} else {
				t.Parallel() // each on a key and a proxy of its own
			}
			srv := sharedServer(t)
			key := testKey(t)
			r, slow := startSlowDrainer(t, 4*time.Second, tc.method)
			acted := make(chan struct{})
			go func() {
				defer close(acted)
				tc.act(t, key, slow, srv.DSN())
			}()
			nextAfterSlowReturned(t, r)
			endedForTheWindow(t, r)
			<-acted // its t.Errorf must come before the test ends
		})
	}
}

// The same while the slow leader stops: it drains (OnElected cancelled,
// working for two seconds more), renewing meanwhile, and those renews
// answer late: the drain goes on, and the session stays open, until
// OnElected returned.
func TestLateRenewWhileStoppingKeepsLock(t *testing.T) {
	r, slow := startSlowDrainer(t, 2*time.Second, "")
	go slow.stop()
	nextAfterSlowReturned(t, r)
}

// startSlowDrainer runs elector "slow" behind a proxy, whose OnElected
// works for drain after its context's end, and candidate "next" beside it;
// once slow leads, its replies are slowed (700 ms) past its trust window
// (500 ms), and it does not connect again. With slowAt "" the path slows
// after slow's third renew; else just as slow's lease sends its first
// call of that method (Proclaim, Candidate, Precede, Reserve or
// Requester; with the middle three, next is ranked above slow).
func startSlowDrainer(t *testing.T, drain time.Duration, slowAt string) (*recorder, *running) {
	srv := sharedServer(t)
	r := newRecorder(t)
	proxy := newProxy(t, srv)
	key := testKey(t)
	var down atomic.Bool
	slowDown := func() {
		down.Store(true)
		proxy.DelayReplies(700 * time.Millisecond)
	}
	slow := startWith(t, r, opts{dsn: proxy.DSN(), key: key, id: "slow", release: 5 * time.Second,
		onLead: func(ctx context.Context, l leader.Leadership) {
			<-ctx.Done()
			time.Sleep(drain)
		},
		wrap: func(ls elector.Lease) elector.Lease { return &slowsAt{Lease: ls, method: slowAt, slow: slowDown} },
	}, func(c *elector.Config) {
		c.Observer = demotionsTo{r: r}
		c.Values.Enabled = slowAt == "Proclaim"
		c.Connect = leader.ConnectFunc(func(ctx context.Context) (*pgx.Conn, error) {
			if down.Load() {
				return nil, errors.New("this elector stays down")
			}
			return pgx.Connect(ctx, proxy.DSN())
		})
	})
	elected := r.next("elected", "slow")
	startWith(t, r, opts{dsn: srv.DSN(), key: key, id: "next"}, func(c *elector.Config) {
		if slowAt == "Candidate" || slowAt == "Precede" || slowAt == "Reserve" {
			c.Priority = 1 // tells slow its rank, which slow looks up
		}
	})
	if slowAt != "" {
		return r, slow
	}
	// Renews past the first two (the first announces the leader, the next
	// prepares the plain renew), so that each slowed renew is one round
	// trip answered within the drain (a statement's first use is two).
	eventually(t, "slow's third renew", func() (bool, string) {
		st := slow.e.Status()
		return st.LastRenew.Sub(elected.at) > 2*tInterval, fmt.Sprint(st.LastRenew.Sub(elected.at))
	})
	slowDown()
	return r, slow
}

// endedForTheWindow checks that slow's tenure ended for its trust window
// (the Observer hears the reason as the step-down begins), not for what
// the statement it lapsed under would have done (a resign request
// granted, a preference handover).
func endedForTheWindow(t *testing.T, r *recorder) {
	t.Helper()
	if d := r.next("observed-demoted", "slow"); !errors.Is(d.reason, leader.ErrRenewDeadline) {
		t.Fatalf("slow's tenure ended with %v, want ErrRenewDeadline", d.reason)
	}
}

// demotionsTo records what an elector's Observer hears of its demotions,
// as events of kind "observed-demoted": the reason the tenure ended with,
// before a drain (whose own fault may replace the reason OnDemoted gets).
type demotionsTo struct {
	leader.NopObserver
	r *recorder
}

func (o demotionsTo) Demoted(l leader.Leadership, reason error) {
	o.r.add(event{kind: "observed-demoted", id: l.Identity, reason: reason})
}

// slowsAt slows the path (slow) as its first call of method goes out.
type slowsAt struct {
	elector.Lease
	method string
	slow   func()
	once   sync.Once
}

func (s *slowsAt) at(method string) {
	if method == s.method {
		s.once.Do(s.slow)
	}
}

func (s *slowsAt) Proclaim(ctx context.Context, t *lockconn.Target, proclaimSQL, keyName string, value []byte) error {
	s.at("Proclaim")
	return s.Lease.Proclaim(ctx, t, proclaimSQL, keyName, value)
}

func (s *slowsAt) Candidate(ctx context.Context, t *lockconn.Target, pid uint32) (string, bool, error) {
	s.at("Candidate")
	return s.Lease.Candidate(ctx, t, pid)
}

func (s *slowsAt) Precede(ctx context.Context, t *lockconn.Target, to string) (bool, bool, error) {
	s.at("Precede")
	return s.Lease.Precede(ctx, t, to)
}

func (s *slowsAt) Reserve(ctx context.Context, t *lockconn.Target, to string, within time.Duration) error {
	s.at("Reserve")
	return s.Lease.Reserve(ctx, t, to, within)
}

func (s *slowsAt) Requester(ctx context.Context, pid uint32, roles []string) (string, bool, bool, error) {
	s.at("Requester")
	return s.Lease.Requester(ctx, pid, roles)
}

// nextAfterSlowReturned waits for next's election, which must come after
// slow's OnElected returned, and slow's demotion with ErrRenewDeadline.
func nextAfterSlowReturned(t *testing.T, r *recorder) {
	t.Helper()
	e := r.next("elected", "next")
	if returned := r.lastAt("returned", "slow"); returned.IsZero() || e.at.Before(returned) {
		t.Fatalf("next elected before slow's OnElected returned:%s", r.dump())
	}
	if d := r.next("demoted", "slow"); !errors.Is(d.reason, leader.ErrRenewDeadline) {
		t.Fatalf("slow demoted with %v, want ErrRenewDeadline", d.reason)
	}

}

// Between renews the leader reads its idle socket: with a 5 s interval, a
// terminated backend's FATAL still demotes it within a fraction of a
// second, not at the next renew.
func TestTerminatedBackendNoticedBetweenRenews(t *testing.T) {
	srv := sharedServer(t)
	r := newRecorder(t)
	startWith(t, r, opts{dsn: srv.DSN(), key: testKey(t), id: "idle-reader", deadline: 10 * time.Second, lease: 20 * time.Second},
		func(c *elector.Config) { c.RenewInterval = 5 * time.Second })
	r.next("elected", "idle-reader")
	killed := time.Now()
	if n, err := srv.TerminateBackend(context.Background(), "idle-reader"); err != nil || n != 1 {
		t.Fatalf("terminate: %d %v", n, err)
	}
	d := r.next("demoted", "idle-reader")
	if took := d.at.Sub(killed); took > time.Second || !errors.Is(d.reason, leader.ErrConnectionLost) {
		t.Fatalf("demoted %s after pg_terminate_backend with %v; want ErrConnectionLost within a second (the interval is 5 s)", took, d.reason)
	}
}

// The first failed renew ends the tenure with its reason. (A live session
// cannot be made to drop its lock from outside, so a scripted lease fails
// the fourth renew.)
func TestScriptedFirstFailedRenewDemotes(t *testing.T) {
	ls := &scriptLease{campaigns: []step{{round: lockconn.Round{Held: true, Free: true}}},
		renews: []error{nil, nil, nil, leader.ErrLockLost}}
	demoted := make(chan error, 1)
	sc := runScripted(t, ls, func(c *elector.Config) {
		c.Callbacks.OnDemoted = func(l leader.Leadership, reason error) { demoted <- reason }
	})
	sc.waitElected(t)
	if reason := recv(t, demoted, "the demotion"); !errors.Is(reason, leader.ErrLockLost) {
		t.Fatalf("reason %v, want ErrLockLost", reason)
	}
	if n := ls.count("announce") + ls.count("renew"); n != 4 {
		t.Fatalf("demoted after %d renews (the first announces), want at the 4th (the first that failed)", n)
	}
}

// While a stepping-down leader drains, it no longer leads: IsLeader,
// Leadership, Status and leader-only readiness all say so at once.
func TestNotLeaderWhileDraining(t *testing.T) {
	srv := sharedServer(t)
	r := newRecorder(t)
	draining, release := make(chan struct{}), make(chan struct{})
	a := start(t, r, opts{dsn: srv.DSN(), key: testKey(t), id: "drain-probe",
		onLead: func(ctx context.Context, l leader.Leadership) {
			<-ctx.Done()
			close(draining)
			<-release
		}})
	r.next("elected", "drain-probe")
	ready := readyProbe(a.e)
	if err := ready(); err != nil {
		t.Fatalf("leader not ready: %v", err)
	}
	resigned := make(chan error, 1)
	go func() { resigned <- a.e.Resign(context.Background()) }()
	recv(t, draining, "the drain")
	_, ok := a.e.Leadership()
	st := a.e.Status()
	if a.e.IsLeader() || ok || st.Leading || st.Tenure || ready() == nil {
		t.Fatalf("during the drain: IsLeader %v, Leadership %v, Status.Leading %v, Status.Tenure %v, ready %v",
			a.e.IsLeader(), ok, st.Leading, st.Tenure, ready() == nil)
	}
	close(release)
	if err := recv(t, resigned, "Resign"); err != nil {
		t.Fatal(err)
	}
}

// The reconnect backoff grows while connecting keeps failing: attempts are
// counted up and the delays reach the cap.
func TestReconnectBackoffGrows(t *testing.T) {
	obs := newErrObserver()
	delays := make(chan [2]int64, 64)
	e, err := elector.New(elector.Config{
		Connect: elector.DSN("postgres://u@127.0.0.1:1/db?connect_timeout=1"), Key: testKey(t),
		Observer: &delayObserver{errObserver: obs, ch: delays}, ReconnectMaxDelay: 200 * time.Millisecond,
		Callbacks: elector.Callbacks{OnElected: func(context.Context, leader.Leadership) {}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() { cancel(); <-done }()
	var maxDelay time.Duration
	for want := int64(1); want <= 8; want++ {
		d := recv(t, delays, "a reconnect")
		if d[0] != want {
			t.Fatalf("attempt %d reported as %d: the count was reset", want, d[0])
		}
		maxDelay = max(maxDelay, time.Duration(d[1]))
	}
	if maxDelay < 100*time.Millisecond {
		t.Fatalf("longest of 8 delays %s: the backoff does not grow towards its 200ms cap", maxDelay)
	}
}

// A session that lasted longer than the lease resets the backoff: the first
// reconnect after it is attempt 1 again.
func TestReconnectBackoffResetsAfterLastingSession(t *testing.T) {
	srv := testpg.Start(t)
	if err := srv.Stop(testpg.Fast); err != nil {
		t.Fatal(err)
	}
	r := newRecorder(t)
	delays := make(chan [2]int64, 256)
	startWith(t, r, opts{dsn: srv.DSN(), key: testKey(t), id: "resetter"}, func(c *elector.Config) {
		c.Observer = &delayObserver{errObserver: newErrObserver(), ch: delays}
	})
	for i := 0; i < 3; i++ {
		recv(t, delays, "a failed connection attempt")
	}
	if err := srv.StartAgain(); err != nil {
		t.Fatal(err)
	}
	e := r.next("elected", "resetter")
	for len(delays) > 0 {
		<-delays
	}
	for {
		time.Sleep(time.Until(e.at.Add(tLease + 200*time.Millisecond))) // let the session outlast the lease
		n, err := srv.TerminateBackend(context.Background(), "resetter")
		if err != nil || n > 1 {
			t.Fatalf("terminate: %d %v", n, err)
		}
		if n == 1 {
			break
		}
		// No session to end: on a loaded machine the elector missed a
		// renew and is between two sessions. Its next one must outlast
		// the lease in turn.
		e = r.next("elected", "resetter")
		for len(delays) > 0 {
			<-delays
		}
	}
	if d := recv(t, delays, "the reconnect after the lasting session"); d[0] != 1 {
		t.Fatalf("first reconnect after a session longer than the lease is attempt %d, want 1", d[0])
	}
}

// delayObserver reports each reconnect's attempt number and delay.
type delayObserver struct {
	*errObserver
	ch chan [2]int64
}

func (o *delayObserver) Reconnecting(k leader.Key, id string, attempt int, delay time.Duration, err error) {
	o.errObserver.Reconnecting(k, id, attempt, delay, err)
	select {
	case o.ch <- [2]int64{int64(attempt), int64(delay)}:
	default:
	}
}

// Every boundary of every timing rule: the smallest valid value passes and
// the largest invalid one fails.
func TestConfigBoundaries(t *testing.T) {
	ok := elector.Config{
		Connect:       elector.DSN("postgres://u@127.0.0.1:1/db"),
		Key:           leader.KeyFromName("x"),
		Callbacks:     elector.Callbacks{OnElected: func(context.Context, leader.Leadership) {}},
		RenewInterval: time.Second, RenewDeadline: 3 * time.Second, LeaseDuration: 6 * time.Second,
	}
	tests := []struct {
		name  string
		edit  func(*elector.Config)
		field string // "" when valid
	}{
		{"interval 1ms", func(c *elector.Config) { c.RenewInterval = time.Millisecond }, ""},
		{"interval just under 1ms", func(c *elector.Config) { c.RenewInterval = time.Millisecond - 1 }, "RenewInterval"},
		{"deadline just over interval", func(c *elector.Config) { c.RenewDeadline = time.Second + 1 }, ""},
		{"deadline == interval", func(c *elector.Config) { c.RenewDeadline = time.Second }, "RenewDeadline"},
		{"lease just over deadline", func(c *elector.Config) { c.LeaseDuration = 3*time.Second + 1 }, ""},
		{"lease == deadline", func(c *elector.Config) { c.LeaseDuration = 3 * time.Second }, "LeaseDuration"},
		{"release timeout: the default", func(c *elector.Config) { c.ReleaseTimeout = 0 }, ""},
		{"release timeout -1ns", func(c *elector.Config) { c.ReleaseTimeout = -1 }, "ReleaseTimeout"},
		{"reconnect delay -1ns", func(c *elector.Config) { c.ReconnectMaxDelay = -1 }, "ReconnectMaxDelay"},
		{"identity of 63 bytes", func(c *elector.Config) { c.Identity = strings.Repeat("a", 63) }, ""},
		{"identity of 64 bytes", func(c *elector.Config) { c.Identity = strings.Repeat("a", 64) }, "Identity"},
		{"identity with a control character", func(c *elector.Config) { c.Identity = "a\tb" }, "Identity"},
		{"identity with ~ (the last printable)", func(c *elector.Config) { c.Identity = "a~b" }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.edit(&c)
			_, err := elector.New(c)
			var ce *elector.ConfigError
			switch {
			case tt.field == "" && err != nil:
				t.Fatalf("valid config rejected: %v", err)
			case tt.field != "" && (!errors.As(err, &ce) || ce.Field != tt.field):
				t.Fatalf("want a ConfigError on %s, got %v", tt.field, err)
			}
		})
	}
}

// A demotion by a fault is logged at warn level; a resign at info.
func TestFaultDemotionLogsWarn(t *testing.T) {
	srv := sharedServer(t)
	r := newRecorder(t)
	core, logs := observer.New(zap.InfoLevel)
	a := start(t, r, opts{dsn: srv.DSN(), key: testKey(t), id: "warn-a", logger: zap.New(core)})
	r.next("elected", "warn-a")
	if err := a.e.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.next("demoted", "warn-a")
	r.next("elected", "warn-a") // alone, it campaigns and wins again
	if _, err := srv.TerminateBackend(context.Background(), "warn-a"); err != nil {
		t.Fatal(err)
	}
	r.next("demoted", "warn-a")
	var levels []zapcore.Level
	for _, e := range logs.FilterMessage("demoted").All() {
		levels = append(levels, e.Level)
	}
	if len(levels) != 2 || levels[0] != zapcore.InfoLevel || levels[1] != zapcore.WarnLevel {
		t.Fatalf("demotion log levels %v, want [info warn] (resign, then a killed backend)", levels)
	}
}
