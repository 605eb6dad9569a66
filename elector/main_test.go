package elector_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/leader"
)

var shared testpg.Shared

// sharedServer returns the package's throwaway server, for tests that do
// not restart it. Each test uses its own key.
func sharedServer(t testing.TB) *testpg.Server { return shared.Get(t) }

// The tests marked by waitsForRounds run four at a time (see there).
func TestMain(m *testing.M) {
	testpg.DefaultParallel(4)
	os.Exit(testpg.Main(m, childMain, &shared))
}

// Test timings: short enough to keep the suite quick, with generous margins
// for a loaded 2-core machine.
const (
	tInterval = 100 * time.Millisecond
	tDeadline = 500 * time.Millisecond
	tLease    = 1500 * time.Millisecond
	tRelease  = 2 * time.Second
	waitLong  = 30 * time.Second
)

type event struct {
	kind   string // elected, returned (OnElected returned), demoted, newleader
	id     string // the elector's identity
	leader string // for newleader
	reason error
	term   int64
	at     time.Time
}

// recorder collects the callbacks of several electors and checks that
// OnElected and OnDemoted come in pairs.
type recorder struct {
	t       testing.TB
	mu      sync.Mutex
	events  []event
	changed chan struct{} // closed and replaced on every add
	cursor  map[string]int
	// stubborn names electors whose OnElected may outlive ReleaseTimeout,
	// so that their OnDemoted may come before it returns.
	stubborn map[string]bool
}

func newRecorder(t testing.TB) *recorder {
	r := &recorder{t: t, changed: make(chan struct{}), cursor: map[string]int{}, stubborn: map[string]bool{}}
	t.Cleanup(r.checkPairs)
	return r
}

func (r *recorder) add(e event) {
	e.at = time.Now()
	r.mu.Lock()
	r.events = append(r.events, e)
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

// checkPairs asserts the callback contract per elector: OnElected and
// OnDemoted alternate, each tenure ends, OnDemoted comes after OnElected
// returned (unless the elector is stubborn: then ReleaseTimeout may pass
// first), and a new OnElected never starts while the previous one still
// runs.
func (r *recorder) checkPairs() {
	r.mu.Lock()
	defer r.mu.Unlock()
	open, running := map[string]bool{}, map[string]bool{}
	for _, e := range r.events {
		switch e.kind {
		case "elected":
			if open[e.id] {
				r.t.Errorf("%s: OnElected twice without OnDemoted", e.id)
			}
			if running[e.id] {
				r.t.Errorf("%s: OnElected started while the previous one still ran", e.id)
			}
			open[e.id], running[e.id] = true, true
		case "returned":
			running[e.id] = false
		case "demoted":
			if !open[e.id] {
				r.t.Errorf("%s: OnDemoted without OnElected", e.id)
			}
			if running[e.id] && !r.stubborn[e.id] {
				r.t.Errorf("%s: OnDemoted before OnElected returned", e.id)
			}
			open[e.id] = false
		}
	}
	for id, o := range open {
		if o {
			r.t.Errorf("%s: OnElected never followed by OnDemoted", id)
		}
	}
}

// snapshot is a copy of the events so far.
func (r *recorder) snapshot() []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// dump lists the events so far, one per line, for a failure's message.
func (r *recorder) dump() string {
	var b strings.Builder
	var t0 time.Time
	for i, e := range r.snapshot() {
		if i == 0 {
			t0 = e.at
		}
		fmt.Fprintf(&b, "\n  %8.3fs %-9s %s", e.at.Sub(t0).Seconds(), e.kind, e.id)
		if e.leader != "" {
			fmt.Fprintf(&b, " leader %s", e.leader)
		}
		if e.reason != nil {
			fmt.Fprintf(&b, " (%v)", e.reason)
		}
	}
	return b.String()
}

// count counts the events of kind by id so far.
func (r *recorder) count(kind, id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if e.kind == kind && e.id == id {
			n++
		}
	}
	return n
}

// next returns the next event of kind (of any elector when id is ""),
// waiting for it. Cursors are kept per kind and per (kind, id), so waiting
// for one kind of event never skips another, and an "any elector" query
// starts after the last event of that kind already returned.
func (r *recorder) next(kind, id string) event {
	r.t.Helper()
	timeout := time.After(waitLong)
	q, anyQ := kind+"|"+id, kind+"|"
	for {
		r.mu.Lock()
		for i := r.cursor[q]; i < len(r.events); i++ {
			if e := r.events[i]; e.kind == kind && (id == "" || e.id == id) {
				r.cursor[q] = i + 1
				r.cursor[anyQ] = max(r.cursor[anyQ], i+1)
				r.mu.Unlock()
				return e
			}
		}
		changed := r.changed
		r.mu.Unlock()
		select {
		case <-changed:
		case <-timeout:
			r.t.Fatalf("no %s event for %q within %s", kind, id, waitLong)
		}
	}
}

type opts struct {
	dsn      string
	key      leader.Key
	id       string
	onLead   func(ctx context.Context, l leader.Leadership) // default: wait for ctx
	release  time.Duration
	logger   *zap.Logger
	lease    time.Duration
	deadline time.Duration
	fencing  elector.Fencing
	wrap     func(elector.Lease) elector.Lease // each real session, passed through it
}

type running struct {
	e    *elector.Elector
	stop func()
	err  chan error
}

// start runs an elector until the test ends (or stop is called).
func start(t testing.TB, r *recorder, o opts) *running {
	t.Helper()
	return startWith(t, r, o, nil)
}

// startWith is start with a last edit of the Config.
func startWith(t testing.TB, r *recorder, o opts, edit func(*elector.Config)) *running {
	t.Helper()
	onLead := o.onLead
	if onLead == nil {
		onLead = func(ctx context.Context, l leader.Leadership) { <-ctx.Done() }
	}
	cfg := elector.Config{
		Connect:  elector.DSN(o.dsn),
		Key:      o.key,
		Identity: o.id,
		Logger:   testLogger(t, o.logger),
		Callbacks: elector.Callbacks{
			OnElected: func(ctx context.Context, l leader.Leadership) {
				r.add(event{kind: "elected", id: l.Identity, term: l.Term})
				onLead(ctx, l)
				r.add(event{kind: "returned", id: l.Identity, term: l.Term})
			},
			OnDemoted: func(l leader.Leadership, reason error) {
				r.add(event{kind: "demoted", id: l.Identity, reason: reason})
			},
			OnNewLeader: func(id string) { r.add(event{kind: "newleader", id: o.id, leader: id}) },
		},
		RenewInterval:  tInterval,
		RenewDeadline:  tDeadline,
		LeaseDuration:  tLease,
		ReleaseTimeout: tRelease,
		Fencing:        o.fencing,
	}
	if o.release != 0 {
		cfg.ReleaseTimeout = o.release
	}
	if o.lease != 0 {
		cfg.LeaseDuration = o.lease
	}
	if o.deadline != 0 {
		cfg.RenewDeadline = o.deadline
	}
	if edit != nil {
		edit(&cfg)
	}
	e, err := elector.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if o.wrap != nil {
		elector.WrapLease(e, o.wrap)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rn := &running{e: e, err: make(chan error, 1)}
	go func() { rn.err <- e.Run(ctx) }()
	var once sync.Once
	rn.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-rn.err:
				if err != nil {
					t.Errorf("%s: Run: %v", o.id, err)
				}
			case <-time.After(waitLong):
				t.Errorf("%s: Run did not return within %s of cancel", o.id, waitLong)
			}
		})
	}
	t.Cleanup(rn.stop)
	return rn
}

func testKey(t testing.TB) leader.Key { return leader.KeyFromName(t.Name()) }

// childMain is the body of a child process. Role "elector" runs one elector
// from the environment and reports its callbacks as events on stdout; it
// reads commands ("resign", "exit") on stdin.
func childMain(role string) int {
	em := testpg.NewEmitter(os.Stdout)
	switch role {
	case "elector":
	default:
		fmt.Fprintf(os.Stderr, "unknown child role %q\n", role)
		return 2
	}
	dur := func(name string, def time.Duration) time.Duration {
		if v := os.Getenv(name); v != "" {
			d, err := time.ParseDuration(v)
			if err == nil {
				return d
			}
		}
		return def
	}
	id := os.Getenv("CHILD_ID")
	var (
		lastMu sync.Mutex
		last   leader.Leadership
	)
	e, err := elector.New(elector.Config{
		Fencing:  elector.Fencing{Enabled: os.Getenv("CHILD_FENCING") != ""},
		Connect:  elector.DSN(os.Getenv("CHILD_DSN")),
		Key:      leader.KeyFromName(os.Getenv("CHILD_KEY")),
		Identity: id,
		Callbacks: elector.Callbacks{
			OnElected: func(ctx context.Context, l leader.Leadership) {
				lastMu.Lock()
				last = l
				lastMu.Unlock()
				em.Emit(testpg.Event{Ev: "elected", Identity: id, Term: l.Term})
				<-ctx.Done()
				em.Emit(testpg.Event{Ev: "ctxdone", Identity: id, Term: l.Term})
			},
			OnDemoted: func(l leader.Leadership, reason error) {
				em.Emit(testpg.Event{Ev: "demoted", Identity: id, Term: l.Term, Err: leader.ReasonLabel(reason)})
			},
		},
		RenewInterval:  dur("CHILD_INTERVAL", tInterval),
		RenewDeadline:  dur("CHILD_DEADLINE", tDeadline),
		LeaseDuration:  dur("CHILD_LEASE", tLease),
		ReleaseTimeout: tRelease,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	em.Emit(testpg.Event{Ev: "started", Identity: id, Data: strconv.Itoa(os.Getpid())})
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			switch sc.Text() {
			case "resign":
				e.Resign(ctx)
			case "write":
				// A fenced write with the last leadership, whether or not
				// this process still leads: what a stale leader would do.
				lastMu.Lock()
				l := last
				lastMu.Unlock()
				err := fencedWrite(context.Background(), os.Getenv("CHILD_DSN"), l)
				em.Emit(testpg.Event{Ev: "write", Identity: id, Term: l.Term, Err: errString(err)})
			case "exit":
				cancel()
				return
			}
		}
		cancel() // stdin closed: the parent is gone
	}()
	err = <-done
	em.Emit(testpg.Event{Ev: "exited", Identity: id, Err: fmt.Sprint(err)})
	if err != nil {
		return 1
	}
	return 0
}

func startChild(t testing.TB, dsn, key, id string, env ...string) *testpg.Child {
	t.Helper()
	c := testpg.StartChild(t, "elector", append([]string{"CHILD_DSN=" + dsn, "CHILD_KEY=" + key, "CHILD_ID=" + id}, env...)...)
	if _, err := c.WaitTimeout("started", waitLong); err != nil {
		t.Fatal(err)
	}
	return c
}

// testLogger returns l, or with PGLEADER_TEST_LOGS set a logger into the
// test's output.
func testLogger(t testing.TB, l *zap.Logger) *zap.Logger {
	if l == nil && os.Getenv("PGLEADER_TEST_LOGS") != "" {
		return zaptest.NewLogger(t)
	}
	return l
}

// waitsForRounds marks a test that spends most of its time waiting for
// followers' rounds (an heir's is a lock wait of three LeaseDurations) and
// little of it on a CPU: it runs in parallel with the other tests so
// marked (four at once unless -parallel says otherwise; see TestMain),
// after the package's other tests. Each marked test uses its own
// key, roles and identities, or a server of its own, and changes no
// server-wide setting, so none can see another's electors or hostile
// sessions; the package's time is then not the sum of their waits.
func waitsForRounds(t *testing.T) {
	t.Helper()
	t.Parallel()
}
