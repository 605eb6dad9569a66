package group

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/leader"
)

// scriptWire stands in for PostgreSQL under a member: the rounds the
// tests run against it reach what a real server rarely does (a full lock
// table in the middle of an exchange, a busy term row, a round after the
// trust window closed). It holds locks as a backend would.
type scriptWire struct {
	mu      sync.Mutex
	held    map[tag]bool
	members []string
	// tableFull: the next exchanges take the first key wanted, then fail
	// with the lock table full (what the server does when it runs out in
	// the middle of a statement: the locks taken before stay).
	tableFull int
	// stuckFull: every exchange that wants a key fails with the lock
	// table full, taking none (another session keeps the table full).
	stuckFull bool
	// busyBumps: the next term bumps meet a locked term row; fullBumps,
	// a full lock table (their transaction needs a slot for its id).
	busyBumps, fullBumps int
	term                 int64
	calls                map[string]int
	// roundDelay: a full round's reply comes this late; onExchange runs
	// while an exchange is in flight.
	roundDelay time.Duration
	onExchange func()
	// onBump runs while a term bump is in flight; block: a full round is
	// never answered (it ends with its context).
	onBump func()
	block  bool
	// scanDelay: a scan round's reply comes this much later still; scans:
	// when each scan round was answered; stacked: tries of a key already
	// held (on a server, the lock stacks: one unlock would not free it).
	scanDelay time.Duration
	scans     []time.Time
	stacked   int
	// notes are the notifications the idle session reads (nil: none).
	notes chan *pgconn.Notification
	// direct: the session is Direct, and a full round without a scan is a
	// ping.
	direct bool
}

func newScriptWire(members ...string) *scriptWire {
	return &scriptWire{held: map[tag]bool{}, members: members, calls: map[string]int{}}
}

func (w *scriptWire) count(call string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.calls[call]
}

func (w *scriptWire) PID() uint32 { return 4242 }
func (w *scriptWire) Close()      {}
func (w *scriptWire) Join(context.Context) (bool, error) {
	return true, nil
}
func (w *scriptWire) RosterHolder(context.Context) (lockconn.SpaceHolder, error) {
	return lockconn.SpaceHolder{}, nil
}
func (w *scriptWire) Round(ctx context.Context, _ string, scan bool) (lockconn.Scan, error) {
	if w.block {
		<-ctx.Done()
		return lockconn.Scan{}, ctx.Err()
	}
	if w.roundDelay > 0 {
		time.Sleep(w.roundDelay)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls["round"]++
	if !scan {
		w.calls["check"]++
		return lockconn.Scan{}, nil
	}
	if w.scanDelay > 0 {
		w.mu.Unlock()
		time.Sleep(w.scanDelay)
		w.mu.Lock()
	}
	w.calls["scan"]++
	w.scans = append(w.scans, time.Now())
	sc := lockconn.Scan{Held: map[tag]bool{}, Members: w.members, PIDs: map[uint32]string{}}
	for k := range w.held {
		sc.Held[k] = true
	}
	return sc, nil
}

func (w *scriptWire) Direct() bool { return w.direct }
func (w *scriptWire) Ping(ctx context.Context) error {
	if w.block {
		<-ctx.Done()
		return ctx.Err()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.direct {
		return lockconn.ErrNotDirect
	}
	w.calls["round"]++
	w.calls["ping"]++
	return nil
}

func (w *scriptWire) Exchange(ctx context.Context, x lockconn.Exchange) ([]tag, bool, error) {
	if w.onExchange != nil {
		w.onExchange()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls["exchange"]++
	for _, k := range x.Unlock {
		delete(w.held, k)
	}
	for _, k := range x.Want {
		if w.held[k] {
			w.stacked++
		}
	}
	if len(x.Want) > 0 && (w.stuckFull || w.tableFull > 0) {
		if !w.stuckFull {
			w.tableFull--
			w.held[x.Want[0]] = true
		}
		return nil, len(x.Unlock) > 0, fmt.Errorf("%w: %w", lockconn.ErrLockTableFull, &pgconn.PgError{Code: "53200", Message: "out of shared memory"})
	}
	var won []tag
	for _, k := range x.Want {
		if !w.held[k] {
			w.held[k] = true
			won = append(won, k)
		}
	}
	return won, len(x.Unlock) > 0, nil
}
func (w *scriptWire) Bump(ctx context.Context, won []tag, names []string) (map[tag]int64, error) {
	if w.onBump != nil {
		w.onBump()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls["bump"]++
	if w.busyBumps > 0 {
		w.busyBumps--
		return nil, &pgconn.PgError{Code: lockconn.LockNotAvailable, Message: "canceling statement due to lock timeout"}
	}
	if w.fullBumps > 0 {
		w.fullBumps--
		return nil, &pgconn.PgError{Code: "53200", Message: "out of shared memory", Hint: "You might need to increase \"max_locks_per_transaction\"."}
	}
	out := map[tag]int64{}
	for _, k := range won {
		w.term++
		out[k] = w.term
	}
	return out, nil
}
func (w *scriptWire) Broadcast(context.Context, []lockconn.GroupMessage, string) error { return nil }
func (w *scriptWire) Leave(context.Context) error                                      { return nil }
func (w *scriptWire) Wait(ctx context.Context) (*pgconn.Notification, error) {
	select {
	case n := <-w.notes:
		return n, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
func (w *scriptWire) IsGroupChannel(string) bool { return false }

// scripted is a Group whose rounds the test runs one by one.
func scripted(t *testing.T, n int, edit func(*Config)) (*Group, []leader.Key) {
	t.Helper()
	var keys []leader.Key
	for i := range n {
		keys = append(keys, leader.KeyFromName(fmt.Sprintf("%s/%d", t.Name(), i)))
	}
	cfg := Config{Connect: leader.DSN("postgres://u@127.0.0.1:1/db"), Group: "scripted", Keys: keys, Identity: "me",
		SingleConnection: true,
		Callbacks:        Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) { <-ctx.Done() }}}
	if edit != nil {
		edit(&cfg)
	}
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	g.table = lockconn.LockTable{PerTx: 64, Conns: 100}
	t.Cleanup(func() {
		g.demoteAll(context.Canceled)
		g.wg.Wait()
	})
	return g, keys
}

// afterFullTables is a scripted group of n keys after `fulls` scan rounds
// whose exchanges each met a full lock table (each took one key first).
func afterFullTables(t *testing.T, n, fulls int) (*Group, *scriptWire) {
	t.Helper()
	g, _ := scripted(t, n, nil)
	w := newScriptWire("me")
	w.tableFull = fulls
	for range fulls {
		if err := g.round(context.Background(), w, scanRound); err != nil {
			t.Fatalf("a full lock table ended the round: %v", err)
		}
	}
	return g, w
}

// demotedWith waits for the next OnDemoted reason on demoted, which must
// match want.
func demotedWith(t *testing.T, demoted <-chan error, want error, none string) {
	t.Helper()
	select {
	case reason := <-demoted:
		if !errors.Is(reason, want) {
			t.Fatalf("demoted with %v, want %v", reason, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal(none)
	}
}

// sharingWithB is a scripted member of 8 keys beside member "b", after a
// first scan round that shared the keys between the two.
func sharingWithB(t *testing.T) (*Group, *scriptWire) {
	t.Helper()
	g, _ := scripted(t, 8, nil)
	w := newScriptWire("b", "me")
	if err := g.round(context.Background(), w, scanRound); err != nil {
		t.Fatal(err)
	}
	if mine := g.leading(); mine == 0 || mine == 8 {
		t.Fatalf("leading %d of 8 with two members", mine)
	}
	return g, w
}

// leadingThree is a scripted member of 3 keys whose OnDemoted reasons go
// to demoted, after a first scan round that led all three.
func leadingThree(t *testing.T) (*Group, []leader.Key, *scriptWire, chan error) {
	t.Helper()
	demoted := make(chan error, 4)
	g, keys := scripted(t, 3, func(c *Config) {
		c.Callbacks.OnDemoted = func(_ leader.Leadership, reason error) { demoted <- reason }
	})
	w := newScriptWire("me")
	if err := g.round(context.Background(), w, scanRound); err != nil || g.leading() != 3 {
		t.Fatalf("first round: %v, leading %d", err, g.leading())
	}
	return g, keys, w, demoted
}

func (g *Group) leading() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, ks := range g.st.keys {
		if ks.phase == phaseLeading {
			n++
		}
	}
	return n
}

// A light round after the trust window closed is made full, and the keys,
// in doubt since the window's end, are demoted (ErrRenewDeadline) before
// it sends anything: a proof that comes after the window's end leads
// nothing on. Their locks stay held (the session may still be alive): the
// next full round, its window renewed, adopts them once their OnDemoted
// has run, with no try (a try on a held key stacks the lock).
func TestScriptedLightRoundAfterTrustWindowIsFull(t *testing.T) {
	g, _, w, demoted := leadingThree(t)
	ctx := context.Background()
	if err := g.round(ctx, w, lightRound); err != nil || w.count("round") != 1 {
		t.Fatalf("a light round within the window: %v, %d full rounds", err, w.count("round"))
	}
	g.mu.Lock()
	g.st.trustEnd = time.Now().Add(-time.Millisecond)
	before := map[tag]*tenure{}
	for k, ks := range g.st.keys {
		before[k] = ks.tenure
	}
	g.mu.Unlock()
	if err := g.round(ctx, w, lightRound); err != nil {
		t.Fatal(err)
	}
	if n := w.count("round"); n != 2 {
		t.Fatalf("%d full rounds; a light round past the trust window must prove the session", n)
	}
	g.mu.Lock()
	for k, ks := range g.st.keys {
		// A key whose OnDemoted already ran may be adopted by this very
		// round (its check, sent after the lapse, proved the session):
		// a new tenure. The old one must not go on.
		if ks.tenure == before[k] && ks.phase == phaseLeading {
			t.Errorf("key %v: its tenure went on past the trust window", ks.key)
		}
	}
	g.mu.Unlock()
	for range 3 {
		demotedWith(t, demoted, leader.ErrRenewDeadline, "no OnDemoted after the trust window lapsed")
	}
	waitFree(t, g)
	if err := g.round(ctx, w, fullRound); err != nil {
		t.Fatal(err)
	}
	if g.leading() != 3 || w.stacked != 0 || len(w.held) != 3 {
		t.Fatalf("after OnDemoted, a full round: leading %d, %d tries of a held key, %d held; want the 3 adopted", g.leading(), w.stacked, len(w.held))
	}
}

// waitFree waits until no key of g has an OnDemoted to come (each is free,
// or led by a tenure begun since).
func waitFree(t *testing.T, g *Group) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		g.mu.Lock()
		busy := 0
		for _, ks := range g.st.keys {
			if ks.phase == phaseEnding || ks.phase == phaseHanding {
				busy++
			}
		}
		g.mu.Unlock()
		if busy == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d keys still ending after 10 s", busy)
		}
		time.Sleep(time.Millisecond)
	}
}

// A round whose read renewed the trust window is bounded by the new
// window: the old one's end, passing while the round's exchange is still
// out (a slow server), demotes nothing.
func TestScriptedRenewedWindowOutlastsTheOld(t *testing.T) {
	g, keys, w, demoted := leadingThree(t)
	if err := g.SetKeys(append(slices.Clone(keys), leader.KeyFromName(t.Name()+"/new"))); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	g.st.trustEnd = time.Now().Add(20 * time.Millisecond)
	g.mu.Unlock()
	// The exchange (the new key's try) answers well after the old window's
	// end; the round's check, sent before it, renewed the window.
	w.onExchange = func() { time.Sleep(100 * time.Millisecond) }
	if err := g.round(context.Background(), w, fullRound); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-demoted:
		t.Fatalf("demoted (%v) at the old window's end, though the round had renewed it", r)
	default:
	}
	if g.leading() != 4 {
		t.Fatalf("leading %d; want the 3 and the new key", g.leading())
	}
}

// A win whose answer comes after the trust window's end begins no tenure
// (no OnElected starts without trust): the exchange's own answer, or,
// with fencing, the answer of the terms' statement that follows it (the
// lapse, which waits for the state's lock, would end such a tenure only
// after its OnElected had started). A late exchange installs no terms
// either (a transaction, and a term, spent on keys it cannot lead). The
// locks are kept, and the next full round, its window renewed, adopts
// them (with their terms) with no try (a try on a held key stacks the
// lock).
func TestScriptedLateWinBeginsNothing(t *testing.T) {
	for _, tc := range []struct {
		name        string
		fenced      bool
		lateAtTerms bool
	}{{"late exchange", false, false}, {"fencing, late exchange", true, false}, {"fencing, late terms", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			fenced := tc.fenced
			g, keys := scripted(t, 3, func(c *Config) { c.Fencing.Enabled = fenced })
			w := newScriptWire("me")
			late := func() {
				g.mu.Lock()
				g.st.trustEnd = time.Now().Add(-time.Millisecond) // the answer comes late
				g.mu.Unlock()
			}
			if tc.lateAtTerms {
				w.onBump = late
			} else {
				w.onExchange = late
			}
			ctx := context.Background()
			if err := g.round(ctx, w, scanRound); err != nil {
				t.Fatal(err)
			}
			if g.leading() != 0 || len(w.held) != 3 {
				t.Fatalf("a win answered after the window's end: leading %d, %d held; want none led, the 3 kept", g.leading(), len(w.held))
			}
			if n := w.count("bump"); fenced && !tc.lateAtTerms && n != 0 {
				t.Fatalf("a win answered after the window's end installed terms (%d statements) for keys it cannot lead", n)
			}
			w.onExchange, w.onBump = nil, nil
			if err := g.round(ctx, w, fullRound); err != nil {
				t.Fatal(err)
			}
			if g.leading() != 3 || w.stacked != 0 {
				t.Fatalf("the next full round: leading %d, %d tries of a held key; want the 3 adopted", g.leading(), w.stacked)
			}
			g.mu.Lock()
			defer g.mu.Unlock()
			for _, k := range keys {
				if ks := g.st.keys[tagOf(k)]; fenced && ks.tenure.l.Term == 0 {
					t.Errorf("%s adopted without a term", k)
				}
			}
		})
	}
}

// A tenure that ends between its beginning (under the state's lock) and
// the start of its goroutine (after it): a lapse or a stop in between.
// Its OnElected still runs, with its context already cancelled with the
// reason, and OnDemoted follows its return, once.
func TestScriptedTenureEndedBeforeLaunch(t *testing.T) {
	events := make(chan string, 4)
	g, keys := scripted(t, 1, func(c *Config) {
		c.Callbacks.OnElected = func(ctx context.Context, _ leader.Leadership) {
			events <- fmt.Sprintf("elected, cancelled %v", errors.Is(context.Cause(ctx), errLapsed))
		}
		c.Callbacks.OnDemoted = func(_ leader.Leadership, reason error) {
			events <- fmt.Sprintf("demoted, lapsed %v", errors.Is(reason, errLapsed))
		}
	})
	k := tagOf(keys[0])
	g.mu.Lock()
	ks := g.st.keys[k]
	ten := g.begin(ks, 4242, 0)
	g.end(k, ks, errLapsed)
	g.mu.Unlock()
	g.launch([]*tenure{ten})
	for _, want := range []string{"elected, cancelled true", "demoted, lapsed true"} {
		select {
		case got := <-events:
			if got != want {
				t.Fatalf("got %q, want %q", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no %q", want)
		}
	}
	waitFree(t, g)
	select {
	case e := <-events:
		t.Fatalf("more after OnDemoted: %q", e)
	default:
	}
}

// A lapse (no round answered within the trust window) ends every tenure
// at once, but the locks whose OnElected still runs stay held, through
// light, full and scan rounds, until it returns: released earlier, another
// member could lead a key this one still works on. Then they are the
// member's again (adopted, not tried: the session still holds them).
func TestScriptedLapseKeepsLocksUntilOnElectedReturns(t *testing.T) {
	release := make(chan struct{})
	demoted := make(chan error, 4)
	g, keys := scripted(t, 3, func(c *Config) {
		c.Callbacks.OnElected = func(ctx context.Context, _ leader.Leadership) {
			<-ctx.Done()
			<-release
		}
		c.Callbacks.OnDemoted = func(_ leader.Leadership, reason error) { demoted <- reason }
	})
	// Registered after scripted's cleanup, so run before it: a test that
	// fails early must not leave OnElected blocked under its wg.Wait.
	returnAll := sync.OnceFunc(func() { close(release) })
	t.Cleanup(returnAll)
	w := newScriptWire("me")
	ctx := context.Background()
	if err := g.round(ctx, w, scanRound); err != nil || g.leading() != 3 {
		t.Fatalf("first round: %v, leading %d", err, g.leading())
	}
	g.mu.Lock()
	g.st.trustEnd = time.Now().Add(-time.Millisecond)
	g.mu.Unlock()
	for i, kind := range []roundKind{scanRound, lightRound, fullRound, scanRound, fullRound} {
		if err := g.round(ctx, w, kind); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if g.IsLeader(keys[0]) || g.leading() != 0 {
			t.Fatalf("round %d: leading %d after the lapse", i, g.leading())
		}
		if len(w.held) != 3 {
			t.Fatalf("round %d: %d locks held while OnElected still runs; want the 3 kept", i, len(w.held))
		}
	}
	select {
	case r := <-demoted:
		t.Fatalf("OnDemoted (%v) before OnElected returned", r)
	default:
	}
	returnAll()
	for range 3 {
		demotedWith(t, demoted, leader.ErrRenewDeadline, "no OnDemoted after OnElected returned")
	}
	waitFree(t, g)
	if err := g.round(ctx, w, fullRound); err != nil {
		t.Fatal(err)
	}
	if g.leading() != 3 || w.stacked != 0 || len(w.held) != 3 {
		t.Fatalf("after OnDemoted, a full round: leading %d, %d tries of a held key, %d held; want the 3 adopted", g.leading(), w.stacked, len(w.held))
	}
}

// A lapse whose OnElected ignores its context: the round's I/O, and with
// it the session, stays open for ReleaseTimeout at most after the window's
// end, then ends (the session closes, freeing the keys): a member that no
// longer trusts its keys does not keep them from the others for ever.
// Until then it stays open (TestScriptedLapseKeepsLocksUntilOnElectedReturns).
func TestScriptedLapseDrainEndsAtReleaseTimeout(t *testing.T) {
	const releaseTimeout = 300 * time.Millisecond
	g, w := stubbornLeader(t, func(c *Config) { c.ReleaseTimeout = releaseTimeout })
	// The next round is never answered; the window closes 50 ms in.
	lapse := time.Now().Add(50 * time.Millisecond)
	g.mu.Lock()
	g.st.trustEnd = lapse
	g.mu.Unlock()
	unanswered(t, g, w, lapse.Add(releaseTimeout), "ReleaseTimeout had passed since the window's end")
}

// A second lapse while the OnElected calls the first one cancelled still
// run (a late answer kept the session, and their locks): its drain waits
// for them too, for ReleaseTimeout at most. Cutting the I/O at once would
// close the session and free those locks while their OnElected run.
func TestScriptedSecondLapseWaitsForTheFirstsOnElected(t *testing.T) {
	const releaseTimeout = 2 * time.Second // past the next round's RenewDeadline, as by default
	g, w := stubbornLeader(t, func(c *Config) {
		c.RenewInterval, c.RenewDeadline, c.LeaseDuration, c.ReleaseTimeout = 50*time.Millisecond, 200*time.Millisecond, 400*time.Millisecond, releaseTimeout
	})
	// The first lapse: the round begins after the window's end, and its
	// answer (sent after the lapse) keeps the session and the locks.
	first := time.Now()
	g.mu.Lock()
	g.st.trustEnd = first.Add(-time.Millisecond)
	g.mu.Unlock()
	if err := g.round(context.Background(), w, fullRound); err != nil {
		t.Fatalf("the round after the lapse: %v", err)
	}
	if g.leading() != 0 || len(w.held) != 3 {
		t.Fatalf("after the first lapse: leading %d, %d held; want none led, the 3 kept", g.leading(), len(w.held))
	}
	// The second: a round never answered (leading no key, it is bounded
	// by RenewDeadline from its send).
	unanswered(t, g, w, first.Add(releaseTimeout), "ReleaseTimeout had passed since the first lapse's cancel")
}

// stubbornLeader is a scripted member leading 3 keys whose OnElected
// ignores its context (each returns only as the test ends).
func stubbornLeader(t *testing.T, edit func(*Config)) (*Group, *scriptWire) {
	t.Helper()
	release := make(chan struct{})
	g, _ := scripted(t, 3, func(c *Config) {
		edit(c)
		c.Callbacks.OnElected = func(context.Context, leader.Leadership) { <-release }
	})
	// Registered after scripted's cleanup, so run before it.
	t.Cleanup(func() { close(release) })
	w := newScriptWire("me")
	if err := g.round(context.Background(), w, scanRound); err != nil || g.leading() != 3 {
		t.Fatalf("first round: %v, leading %d", err, g.leading())
	}
	return g, w
}

// unanswered runs a full round that is never answered: it must end with
// ErrRenewDeadline (its I/O, and so the session, cut) not before notBefore,
// while the OnElected calls still run, and within 20 s.
func unanswered(t *testing.T, g *Group, w *scriptWire, notBefore time.Time, what string) {
	t.Helper()
	w.block = true
	done := make(chan error, 1)
	go func() { done <- g.round(context.Background(), w, fullRound) }()
	select {
	case err := <-done:
		if !errors.Is(err, leader.ErrRenewDeadline) {
			t.Errorf("the unanswered round ended with %v, want ErrRenewDeadline", err)
		}
		if early := time.Until(notBefore); early > 0 {
			t.Errorf("the round's I/O ended %v before %s, with OnElected still running", early, what)
		}
	case <-time.After(20 * time.Second):
		// The cleanup returns the OnElected calls; the round ends then.
		t.Fatal("the unanswered round's I/O outlived ReleaseTimeout: an OnElected that ignores its context kept the session, and the keys, for ever")
	}
}

// The lock table fills in the middle of an exchange (another session holds
// most of it): no key is begun, the member says so, keeps going, and the
// next full round adopts the key the failed exchange did take and takes
// the rest.
func TestScriptedLockTableFullThenAdopted(t *testing.T) {
	g, w := afterFullTables(t, 4, 1)
	ctx := context.Background()
	st := g.Status()
	if g.leading() != 0 || st.LockTableFull != 1 || !strings.Contains(st.LastError, "lock table") {
		t.Fatalf("after a full table: leading %d, %+v", g.leading(), st)
	}
	if len(w.held) != 1 {
		t.Fatalf("the script holds %d keys, want the one taken before the error", len(w.held))
	}
	if err := g.round(ctx, w, scanRound); err != nil || g.leading() != 4 {
		t.Fatalf("the next round: %v, leading %d, want all 4 (one adopted)", err, g.leading())
	}
}

// A group that can never fit the lock table ends Run (ErrLockTable): a
// full table then is no passing state.
func TestScriptedLockTableTooSmallIsFatal(t *testing.T) {
	g, _ := scripted(t, 4, nil)
	g.table = lockconn.LockTable{PerTx: 1, Conns: 2}
	w := newScriptWire("me")
	w.tableFull = 1
	err := g.round(context.Background(), w, scanRound)
	var lte *LockTableError
	if !errors.Is(err, ErrLockTable) || !errors.As(err, &lte) || lte.Keys != 4 {
		t.Fatalf("want a LockTableError for 4 keys, got %v", err)
	}
}

// A term row locked by an old leader's transaction: the keys won stay held
// without a tenure (no OnElected without a term), and the next full round
// adopts them with their terms.
func TestScriptedBusyTermThenAdopted(t *testing.T) {
	g, keys := scripted(t, 3, func(c *Config) { c.Fencing = Fencing{Enabled: true} })
	w := newScriptWire("me")
	w.busyBumps = 1
	ctx := context.Background()
	if err := g.round(ctx, w, scanRound); err != nil {
		t.Fatalf("a busy term ended the round: %v", err)
	}
	if g.leading() != 0 || len(w.held) != 3 {
		t.Fatalf("busy term: leading %d, held %d; want 0 and 3", g.leading(), len(w.held))
	}
	if err := g.round(ctx, w, scanRound); err != nil || g.leading() != 3 {
		t.Fatalf("next round: %v, leading %d", err, g.leading())
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, k := range keys {
		if ks := g.st.keys[tagOf(k)]; ks.tenure.l.Term == 0 {
			t.Fatalf("%s led without a term", k)
		}
	}
}

// A lock held without a tenure that a round releases (its key left the
// set) is no longer counted as held: when the key comes back before the
// next scan, it is tried again, and led only on a lock the session holds.
// Counted still, it would be adopted, and led, on no lock at all.
func TestScriptedReleasedLeftoverIsTriedAgain(t *testing.T) {
	g, keys := scripted(t, 3, func(c *Config) { c.Fencing = Fencing{Enabled: true} })
	w := newScriptWire("me")
	w.busyBumps = 1
	ctx := context.Background()
	if err := g.round(ctx, w, scanRound); err != nil || g.leading() != 0 || len(w.held) != 3 {
		t.Fatalf("busy term: %v, leading %d, held %d; want 0 and 3", err, g.leading(), len(w.held))
	}
	// keys[0] leaves the set: the next round releases its lock and adopts
	// the other two.
	if err := g.SetKeys(keys[1:]); err != nil {
		t.Fatal(err)
	}
	if err := g.round(ctx, w, fullRound); err != nil || g.leading() != 2 || w.held[tagOf(keys[0])] {
		t.Fatalf("keys[0] out of the set: %v, leading %d, keys[0] held %v; want 2 and false", err, g.leading(), w.held[tagOf(keys[0])])
	}
	// It comes back before any scan.
	if err := g.SetKeys(keys); err != nil {
		t.Fatal(err)
	}
	if err := g.round(ctx, w, fullRound); err != nil || g.leading() != 3 {
		t.Fatalf("keys[0] back: %v, leading %d; want 3", err, g.leading())
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, k := range keys {
		if !w.held[tagOf(k)] {
			t.Fatalf("%s led on a lock the session does not hold", k)
		}
	}
	if w.stacked != 0 {
		t.Fatalf("%d tries of a key already held (the lock stacks)", w.stacked)
	}
}

// The terms of keys just won meet a lock table another role filled (the
// terms' transaction needs a slot for its id): the session goes on, every
// key already led stays led (a key whose OnElected still drains after a
// hand-over among them: a session ended then would let it go while its
// OnElected runs), the member says so, and the keys won are adopted with
// their terms once the table has room.
func TestScriptedLockTableFullAtTheTermsThenAdopted(t *testing.T) {
	g, keys := scripted(t, 4, func(c *Config) { c.Fencing = Fencing{Enabled: true} })
	w := newScriptWire("me")
	ctx := context.Background()
	if err := g.SetKeys(keys[:2]); err != nil {
		t.Fatal(err)
	}
	if err := g.round(ctx, w, scanRound); err != nil || g.leading() != 2 {
		t.Fatalf("first round: %v, leading %d", err, g.leading())
	}
	if err := g.SetKeys(keys); err != nil {
		t.Fatal(err)
	}
	w.fullBumps = 1
	if err := g.round(ctx, w, scanRound); err != nil {
		t.Fatalf("a full lock table at the terms ended the round (and the session): %v", err)
	}
	if g.leading() != 2 || len(w.held) != 4 {
		t.Fatalf("full table at the terms: leading %d, held %d; want 2 and 4", g.leading(), len(w.held))
	}
	if st := g.Status(); st.LockTableFull == 0 || !strings.Contains(st.LastError, "lock table") {
		t.Fatalf("status after the full table: %d, %q", st.LockTableFull, st.LastError)
	}
	if err := g.round(ctx, w, scanRound); err != nil || g.leading() != 4 {
		t.Fatalf("next round: %v, leading %d", err, g.leading())
	}
}

// A lock lost under a live session (found missing by a full round) ends
// that key alone, with ErrLockLost, and the member takes it again only
// after its OnDemoted ran.
func TestScriptedLostKeyEndsAlone(t *testing.T) {
	g, keys, w, demoted := leadingThree(t)
	ctx := context.Background()
	w.mu.Lock()
	delete(w.held, tagOf(keys[0]))
	w.mu.Unlock()
	if err := g.round(ctx, w, scanRound); err != nil {
		t.Fatal(err)
	}
	demotedWith(t, demoted, leader.ErrLockLost, "no OnDemoted for the lost key")
	if g.leading() != 2 {
		t.Fatalf("leading %d after one key was lost, want 2", g.leading())
	}
	// Once its OnDemoted ran, the key is taken again.
	deadline := time.Now().Add(10 * time.Second)
	for g.leading() != 3 && time.Now().Before(deadline) {
		if err := g.round(ctx, w, scanRound); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	if g.leading() != 3 {
		t.Fatal("the lost key was not taken again")
	}
}

// A light round proves nothing, so it must not extend the trust window:
// only a full round's send time does.
func TestScriptedLightRoundDoesNotExtendTrust(t *testing.T) {
	g, _ := scripted(t, 2, nil)
	w := newScriptWire("me")
	ctx := context.Background()
	if err := g.round(ctx, w, scanRound); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	before := g.st.trustEnd
	g.mu.Unlock()
	time.Sleep(2 * time.Millisecond)
	if err := g.round(ctx, w, lightRound); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	after := g.st.trustEnd
	g.mu.Unlock()
	if !after.Equal(before) {
		t.Fatalf("a light round moved the trust window from %s to %s", before.Format(time.StampMicro), after.Format(time.StampMicro))
	}
}

// The trust window runs from when a full round was sent, not from its
// reply: a slow round must not stretch it toward the server's lease.
func TestScriptedTrustFromSend(t *testing.T) {
	g, _ := scripted(t, 2, nil)
	w := newScriptWire("me")
	w.roundDelay = 80 * time.Millisecond
	sent := time.Now()
	if err := g.round(context.Background(), w, scanRound); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	end := g.st.trustEnd
	g.mu.Unlock()
	// The round began a moment after sent; the reply came 80 ms later.
	if limit := sent.Add(g.cfg.RenewDeadline + 20*time.Millisecond); end.After(limit) {
		t.Fatalf("trust window ends %s after the round was sent, past RenewDeadline (%s): it counted from the reply",
			end.Sub(sent), g.cfg.RenewDeadline)
	}
}

// A member that starts stopping while an exchange is in flight begins no
// tenure for the keys that exchange won (they are released next round).
func TestScriptedNoTenureWhileStopping(t *testing.T) {
	g, _ := scripted(t, 3, nil)
	w := newScriptWire("me")
	w.onExchange = func() { g.stop(context.Canceled) }
	if err := g.round(context.Background(), w, scanRound); err != nil {
		t.Fatal(err)
	}
	if n := g.leading(); n != 0 {
		t.Fatalf("%d tenures begun while stopping", n)
	}
	// The next round releases what the exchange took.
	w.onExchange = nil
	if err := g.round(context.Background(), w, scanRound); err != nil {
		t.Fatal(err)
	}
	if len(w.held) != 0 {
		t.Fatalf("a stopping member still holds %d keys", len(w.held))
	}
}

// A resign names its successor: only that member takes the key at once
// (a gift, told on its own channel); every other member, told on the
// group's channel, only keeps it from the one that resigned.
func TestScriptedGiftOnlyToTheSuccessor(t *testing.T) {
	for _, me := range []string{"b", "c"} {
		g, keys := scripted(t, 6, func(c *Config) { c.Identity = me })
		w := newScriptWire("a", "b", "c")
		if err := g.round(context.Background(), w, scanRound); err != nil {
			t.Fatal(err)
		}
		// A key member a owns, resigned to b, from a's main session.
		g.mu.Lock()
		k := firstAssignedTo(g, keys, "a")
		g.st.pids = map[uint32]string{7: "a"}
		g.mu.Unlock()
		if k == (tag{}) {
			t.Fatal("member a owns no key")
		}
		msg := lockconn.EncodeGroup(lockconn.GroupMessage{Kind: lockconn.GroupResigned, Member: "a", Key: k, To: "b"})
		channel := g.channel
		if me == "b" {
			channel = g.myChannel
		}
		g.heard(&pgconn.Notification{PID: 7, Channel: channel, Payload: msg}, 4242)
		g.mu.Lock()
		gift, hold := g.st.keys[k].gift, g.st.keys[k].hold
		g.mu.Unlock()
		if gift != (me == "b") {
			t.Errorf("member %s: gift %v, want %v (the resign names b)", me, gift, me == "b")
		}
		if hold.member != "a" {
			t.Errorf("member %s: the key is not held back from a: %+v", me, hold)
		}
	}
}

// A resign's copy on the group's channel comes with the resigner's next
// full round, and may be old news: the key was resigned to this member on
// its own channel, led, and resigned again since. Such a copy neither
// gives the key back nor replaces what this member knows; a fresh copy
// for a member that knows nothing of the key still keeps it from the
// resigner, without giving it.
func TestScriptedOldResignCopies(t *testing.T) {
	cases := []struct {
		name     string
		phase    phase
		hold     string // the hold this member has on the key before
		to       string
		direct   bool
		wantHold string
		wantGift bool
	}{
		{name: "the successor's own message", to: "b", direct: true, wantHold: "a", wantGift: true},
		{name: "the group's copy, this member knowing nothing", to: "b", wantHold: "a"},
		{name: "the group's copy for another member", to: "c", wantHold: "a"},
		{name: "the group's copy after this member resigned the key back", hold: "b", to: "b", wantHold: "b"},
		{name: "the group's copy while this member leads the key", phase: phaseLeading, hold: "c", to: "c", wantHold: "c"},
		{name: "the group's copy to this member while it leads the key", phase: phaseLeading, to: "b"},
		{name: "a direct message after this member resigned the key back", hold: "b", to: "b", direct: true, wantHold: "a", wantGift: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g, keys := scripted(t, 6, func(c *Config) { c.Identity = "b" })
			w := newScriptWire("a", "b", "c")
			if err := g.round(context.Background(), w, scanRound); err != nil {
				t.Fatal(err)
			}
			g.mu.Lock()
			k := firstAssignedTo(g, keys, "a")
			if k == (tag{}) {
				g.mu.Unlock()
				t.Fatal("member a owns no key")
			}
			g.st.pids = map[uint32]string{7: "a"}
			ks := g.st.keys[k]
			// Only heard looks at the phase; the cleanup's stop must see
			// the real one.
			was := ks.phase
			if tc.phase != 0 {
				ks.phase = tc.phase
			}
			if tc.hold != "" {
				ks.hold = resignHold{member: tc.hold, until: time.Now().Add(time.Minute)}
			}
			g.mu.Unlock()
			channel := g.channel
			if tc.direct {
				channel = g.myChannel
			}
			msg := lockconn.EncodeGroup(lockconn.GroupMessage{Kind: lockconn.GroupResigned, Member: "a", Key: k, To: tc.to})
			g.heard(&pgconn.Notification{PID: 7, Channel: channel, Payload: msg}, 4242)
			g.mu.Lock()
			gift, hold := ks.gift, ks.hold.member
			ks.phase = was
			g.mu.Unlock()
			if gift != tc.wantGift || hold != tc.wantHold {
				t.Fatalf("gift %v, held from %q; want gift %v, held from %q", gift, hold, tc.wantGift, tc.wantHold)
			}
		})
	}
}

// firstAssignedTo is the first of keys g's last assignment gives to
// member, or the zero tag (g.mu held).
func firstAssignedTo(g *Group, keys []leader.Key, member string) tag {
	for _, key := range keys {
		if assignedTo(g, tagOf(key)) == member {
			return tagOf(key)
		}
	}
	return tag{}
}

// assignedTo is the member g's last assignment gives k to (g.mu held).
func assignedTo(g *Group, k tag) string {
	i, ok := g.st.index[k]
	if !ok || i >= len(g.st.owner) || g.st.owner[i] < 0 {
		return ""
	}
	return g.st.assigned[g.st.owner[i]]
}

// A session that fails while the member stops, its keys still handed
// over (their OnElected draining), lost their locks before OnElected
// returned: OnDemoted says the fault, as an Elector's does, not the
// graceful "stopped". Only the stop's own end of the session keeps it.
func TestScriptedFaultDuringStopDrainIsTheReason(t *testing.T) {
	for _, tc := range []struct {
		name  string
		err   error
		label string
	}{
		{"a fault", fmt.Errorf("%w: no answer to a round", leader.ErrConnectionLost), "connection_lost"},
		{"the stop's own end", context.Canceled, "stopped"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var reasons []string
			release := make(chan struct{})
			g, _ := scripted(t, 3, func(c *Config) {
				c.Callbacks.OnElected = func(ctx context.Context, l leader.Leadership) { <-ctx.Done(); <-release }
				c.Callbacks.OnDemoted = func(l leader.Leadership, reason error) {
					mu.Lock()
					reasons = append(reasons, leader.ReasonLabel(reason))
					mu.Unlock()
				}
			})
			w := newScriptWire("me")
			if err := g.round(context.Background(), w, scanRound); err != nil || g.leading() != 3 {
				t.Fatalf("first round: %v, leading %d", err, g.leading())
			}
			g.stop(context.Canceled) // every key handed over; OnElected drains
			g.demoteAll(tc.err)      // and the session ends meanwhile
			close(release)
			g.wg.Wait()
			mu.Lock()
			defer mu.Unlock()
			if len(reasons) != 3 {
				t.Fatalf("OnDemoted reasons %v, want 3", reasons)
			}
			for _, r := range reasons {
				if r != tc.label {
					t.Fatalf("OnDemoted reasons %v, want %s", reasons, tc.label)
				}
			}
		})
	}
}

// A full round proves the session, and with it every key (a session lock
// ends only with its session or its own unlock): it renews the trust
// window without a scan, and a key missing from the server (here dropped
// behind the member's back) is found by the next scan round, not before.
func TestScriptedFullRoundProvesTheSession(t *testing.T) {
	g, keys, w, demoted := leadingThree(t)
	ctx := context.Background()
	// A window about to close (one that closed demotes every key before
	// the round: TestScriptedLightRoundAfterTrustWindowIsFull).
	old := time.Now().Add(time.Second)
	g.mu.Lock()
	g.st.trustEnd = old
	g.mu.Unlock()
	w.mu.Lock()
	delete(w.held, tagOf(keys[0]))
	w.mu.Unlock()
	if err := g.round(ctx, w, fullRound); err != nil {
		t.Fatal(err)
	}
	if w.count("scan") != 1 || w.count("check") != 1 {
		t.Fatalf("a full round: %d scans, %d checks; want the check alone", w.count("scan"), w.count("check"))
	}
	g.mu.Lock()
	renewed := g.st.trustEnd.After(old)
	g.mu.Unlock()
	if !renewed || !g.IsLeader(keys[1]) || g.leading() != 3 {
		t.Fatalf("the full round did not renew the trust window (renewed %v, leading %d)", renewed, g.leading())
	}
	if st := g.Status(); st.Rounds != 2 || st.Scans != 1 || !st.LastScan.Before(st.LastRound) {
		t.Fatalf("status after a scan and a full round: rounds %d, scans %d, last scan %s, last round %s", st.Rounds, st.Scans, st.LastScan, st.LastRound)
	}
	if err := g.round(ctx, w, scanRound); err != nil {
		t.Fatal(err)
	}
	demotedWith(t, demoted, leader.ErrLockLost, "the scan did not find the key's lock gone")
}

// Keys an exchange may have won before the lock table filled are never
// tried again before a scan says whether they are held (a try on a key
// held stacks the lock: one unlock would no longer free it); the scan
// adopts the one that was.
func TestScriptedLockTableFullNoStackBeforeScan(t *testing.T) {
	g, w := afterFullTables(t, 4, 1)
	ctx := context.Background()
	for _, kind := range []roundKind{fullRound, lightRound, fullRound} {
		if err := g.round(ctx, w, kind); err != nil {
			t.Fatal(err)
		}
	}
	if w.stacked != 0 {
		t.Fatalf("%d tries of a key the session held (stacked locks)", w.stacked)
	}
	if g.leading() != 0 {
		t.Fatalf("leading %d before a scan; the keys the failed exchange wanted are in doubt", g.leading())
	}
	if err := g.round(ctx, w, scanRound); err != nil || g.leading() != 4 || w.stacked != 0 {
		t.Fatalf("the scan round: %v, leading %d, stacked %d; want all 4, none stacked", err, g.leading(), w.stacked)
	}
}

// Keys won while a term row was busy are held without a tenure; the next
// round adopts them, scan or not (the exchange said they were won).
func TestScriptedBusyTermAdoptedWithoutScan(t *testing.T) {
	g, _ := scripted(t, 3, func(c *Config) { c.Fencing = Fencing{Enabled: true} })
	w := newScriptWire("me")
	w.busyBumps = 1
	ctx := context.Background()
	if err := g.round(ctx, w, scanRound); err != nil || g.leading() != 0 {
		t.Fatalf("a busy term: %v, leading %d", err, g.leading())
	}
	if err := g.round(ctx, w, fullRound); err != nil || g.leading() != 3 || w.stacked != 0 {
		t.Fatalf("the next full round: %v, leading %d, stacked %d; want 3 adopted, none stacked", err, g.leading(), w.stacked)
	}
	if w.count("scan") != 1 {
		t.Fatalf("%d scans", w.count("scan"))
	}
}

// loopUntil runs a scripted member's loop on w, with renews every 20 ms
// and a trust window of 2 s, until until is true (checked every 5 ms) or
// 30 s have passed, then stops it; the loop must end without an error.
func loopUntil(t *testing.T, g *Group, w *scriptWire, until func() bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.loop(ctx, w) }()
	deadline := time.Now().Add(30 * time.Second)
	for !until() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// fastRenews is the timing of the scripted loop tests: renews every
// 20 ms, a trust window of 2 s.
func fastRenews(c *Config) {
	c.RenewInterval, c.RenewDeadline, c.LeaseDuration = 20*time.Millisecond, 2*time.Second, 3*time.Second
}

// The loop scans at most 0.5% of the member's time: a scan that takes
// 10 ms runs at most every 2 s, with full rounds (every RenewInterval,
// 20 ms) between; and it does run again.
func TestScriptedScansPaced(t *testing.T) {
	g, _ := scripted(t, 3, fastRenews)
	w := newScriptWire("me")
	w.scanDelay = 10 * time.Millisecond
	loopUntil(t, g, w, func() bool { return w.count("scan") >= 3 })
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.scans) < 3 {
		t.Fatalf("%d scans in 30 s; the scan must come again", len(w.scans))
	}
	for i := 1; i < len(w.scans); i++ {
		if gap := w.scans[i].Sub(w.scans[i-1]); gap < 1900*time.Millisecond {
			t.Fatalf("scans %s apart; a 10 ms scan runs at most every 2 s", gap)
		}
	}
	if w.calls["check"] < 2 {
		t.Fatalf("%d full rounds without a scan between %d scans", w.calls["check"], len(w.scans))
	}
}

// Keys a failed exchange left in doubt (the lock table was full) are
// taken at a scan round due at the hints' pace (5 RenewIntervals at
// most), not after the periodic scan's pause: with one slow scan (50 ms:
// the next periodic one 10 s later) the member waited that long to take
// them once the table had room (CI, under load: 30 s without a key).
// Counted in full rounds, not in time: about 5 between the failed
// exchange and the scan that takes the keys, against 500 before.
func TestScriptedDoubtScannedSoon(t *testing.T) {
	g, _ := scripted(t, 4, fastRenews)
	w := newScriptWire("me")
	w.scanDelay = 50 * time.Millisecond
	w.tableFull = 1 // the first scan round's exchange
	var checks, scans, leading int
	loopUntil(t, g, w, func() bool {
		checks, scans, leading = w.count("check"), w.count("scan"), g.leading()
		return leading == 4
	})
	if leading != 4 || scans != 2 || checks > 25 {
		t.Fatalf("leading %d of 4 after %d scans and %d full rounds between; want all 4 at the second scan, at most 25 full rounds after the full table", leading, scans, checks)
	}
}

// While the table stays full, the keys stay in doubt, and their scans
// keep the hints' pace (each copies the whole lock table another role
// filled): one per 5 RenewIntervals, with full rounds that do not scan
// between (about four per scan here), not a scan at every round.
func TestScriptedDoubtScansPaced(t *testing.T) {
	g, _ := scripted(t, 4, fastRenews)
	w := newScriptWire("me")
	w.scanDelay = 10 * time.Millisecond
	w.stuckFull = true
	loopUntil(t, g, w, func() bool { return w.count("check") >= 60 })
	checks, scans := w.count("check"), w.count("scan")
	if checks < 60 || scans > checks {
		t.Fatalf("%d scans and %d full rounds without one while the table stayed full; want fewer scans than those rounds", scans, checks)
	}
	if scans < 3 {
		t.Fatalf("%d scans in %d full rounds: the keys in doubt must be scanned for again", scans, checks)
	}
	t.Logf("%d scans, %d full rounds without one", scans, checks)
}

// The pacing's arithmetic: scans and hints every RenewInterval (hints four
// times as often) while a scan is cheap, and no more than 0.5% of the
// time once it is not (hints at least every 5 RenewIntervals).
func TestScanPacing(t *testing.T) {
	g, _ := scripted(t, 1, nil)
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, tc := range []struct {
		cost, scan, hint time.Duration
	}{
		{0, time.Second, 250 * time.Millisecond},
		{4 * time.Millisecond, time.Second, 800 * time.Millisecond},
		{20 * time.Millisecond, 4 * time.Second, 4 * time.Second},
		{130 * time.Millisecond, 26 * time.Second, 5 * time.Second},
	} {
		g.scanCost = tc.cost
		if s, h := g.scanEvery(), g.hintEvery(); s != tc.scan || h != tc.hint {
			t.Errorf("scan cost %s: scans every %s, hints every %s; want %s and %s", tc.cost, s, h, tc.scan, tc.hint)
		}
	}
}

// A scan round that adopts a lock and meets a full lock table again: the
// adoption goes on, the key the second exchange won before the error is in
// doubt (never tried: that would stack it) until the next scan adopts it.
func TestScriptedAdoptMeetsFullTable(t *testing.T) {
	g, w := afterFullTables(t, 4, 2)
	ctx := context.Background()
	if g.leading() != 1 || len(w.held) != 2 {
		t.Fatalf("after two full tables: leading %d, the script holds %d; want 1 (adopted) and 2", g.leading(), len(w.held))
	}
	if err := g.round(ctx, w, fullRound); err != nil {
		t.Fatal(err)
	}
	if w.stacked != 0 || g.leading() != 1 {
		t.Fatalf("the next full round: stacked %d, leading %d; want none stacked, 1 leading", w.stacked, g.leading())
	}
	if err := g.round(ctx, w, scanRound); err != nil || g.leading() != 4 || w.stacked != 0 {
		t.Fatalf("the scan round: %v, leading %d, stacked %d", err, g.leading(), w.stacked)
	}
}

// A member reported gone (here by its own leave, from its proven session)
// is out of the members at once: the next round takes its keys without a
// scan; a scan that still lists it (its backend still releasing its
// locks) does not hand them back, and asks for another scan soon.
func TestScriptedGoneTakesKeysBeforeScan(t *testing.T) {
	g, w := sharingWithB(t)
	ctx := context.Background()
	g.mu.Lock()
	g.st.pids[777] = "b"
	g.mu.Unlock()
	n := &pgconn.Notification{PID: 777, Channel: g.channel, Payload: lockconn.EncodeGroup(lockconn.GroupMessage{Kind: lockconn.GroupGone, Member: "b"})}
	if wake, ok := g.heard(n, w.PID()); !ok || wake != wakeFull {
		t.Fatalf("a member's gone: wake %d, %v; want a full round now", wake, ok)
	}
	// b's locks are free (the script does not hold them).
	if err := g.round(ctx, w, fullRound); err != nil {
		t.Fatal(err)
	}
	if g.leading() != 8 || w.count("scan") != 1 {
		t.Fatalf("after the gone: leading %d, %d scans; want all 8 taken without a scan", g.leading(), w.count("scan"))
	}
	g.mu.Lock()
	soon := g.soon
	g.mu.Unlock()
	if !soon {
		t.Fatal("no scan asked for after taking a gone member's keys")
	}
	if err := g.round(ctx, w, scanRound); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	handing := 0
	for _, ks := range g.st.keys {
		if ks.phase == phaseHanding {
			handing++
		}
	}
	members := slices.Clone(g.st.members)
	g.mu.Unlock()
	if g.leading() != 8 || handing != 0 || slices.Contains(members, "b") {
		t.Fatalf("a scan still listing the gone member: leading %d, handing %d, members %v", g.leading(), handing, members)
	}
}

// A join from a session not yet known, held back by the hint's pacing, is
// not dropped: a scan runs once the pacing allows (here within about
// 0.5 s), long before the periodic scan (here 4 s), so that members
// joining one after another are each seen.
func TestScriptedHintHeldBack(t *testing.T) {
	g, _ := scripted(t, 3, func(c *Config) {
		c.RenewInterval, c.RenewDeadline, c.LeaseDuration = 100*time.Millisecond, 2*time.Second, 3*time.Second
	})
	w := newScriptWire("me")
	w.scanDelay = 20 * time.Millisecond // scans every 4 s, hints every 0.5 s
	w.notes = make(chan *pgconn.Notification, 4)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.loop(ctx, w) }()
	scans := func() int {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.scans)
	}
	waitScans := func(n int, within time.Duration) time.Time {
		t.Helper()
		deadline := time.Now().Add(within)
		for scans() < n && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		if len(w.scans) < n {
			t.Fatalf("%d scans, want %d", len(w.scans), n)
		}
		return w.scans[n-1]
	}
	waitScans(1, 10*time.Second)
	join := func(pid uint32) {
		w.notes <- &pgconn.Notification{PID: pid, Channel: g.channel, Payload: lockconn.EncodeGroup(lockconn.GroupMessage{Kind: lockconn.GroupJoined})}
	}
	join(901)
	waitScans(2, 10*time.Second)
	join(902) // within the hint's pacing: held back
	sent := time.Now()
	at := waitScans(3, 10*time.Second)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if d := at.Sub(sent); d > 3*time.Second {
		t.Fatalf("the held-back join was scanned for %s later; the periodic scan, not the hint", d)
	}
}

// A member reported gone stays out while scans still list it (a backend
// releasing 33,000 locks takes more than a moment), and is listed again
// once RenewDeadline has passed since the report.
func TestScriptedGoneStaysOutWhileListed(t *testing.T) {
	g, w := sharingWithB(t)
	ctx := context.Background()
	g.mu.Lock()
	g.memberGone("b")
	g.gone["b"] = time.Now().Add(-time.Second) // reported a second ago
	g.mu.Unlock()
	if err := g.round(ctx, w, scanRound); err != nil || g.leading() != 8 {
		t.Fatalf("a scan listing b a second after its report: %v, leading %d; want b kept out, all 8 led", err, g.leading())
	}
	g.mu.Lock()
	wait := g.soonWait
	g.mu.Unlock()
	if wait < time.Second {
		t.Fatalf("the next scan after %s; a report a second old waits about a second more, not 5 ms (hundreds of scans)", wait)
	}
	g.mu.Lock()
	g.gone["b"] = time.Now().Add(-g.cfg.RenewDeadline - time.Second)
	g.soon = false
	g.mu.Unlock()
	if err := g.round(ctx, w, scanRound); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	members, soon := slices.Clone(g.st.members), g.soon
	g.mu.Unlock()
	if !slices.Contains(members, "b") || soon {
		t.Fatalf("past RenewDeadline: members %v, scan soon %v; want b listed again", members, soon)
	}
}

// A member told that it is gone itself (its previous session's end, seen
// by its watcher after this session began) stays in its own members, at
// once and at the next scan: it must not hand its keys over.
func TestScriptedGoneNamingSelf(t *testing.T) {
	g, w := sharingWithB(t)
	ctx := context.Background()
	mine := g.leading()
	g.mu.Lock()
	g.st.pids[777] = "b"
	g.mu.Unlock()
	n := &pgconn.Notification{PID: 777, Channel: g.channel, Payload: lockconn.EncodeGroup(lockconn.GroupMessage{Kind: lockconn.GroupGone, Member: "me"})}
	g.heard(n, w.PID())
	for _, kind := range []roundKind{fullRound, scanRound} {
		if err := g.round(ctx, w, kind); err != nil {
			t.Fatal(err)
		}
		g.mu.Lock()
		members := slices.Clone(g.st.members)
		g.mu.Unlock()
		if !slices.Contains(members, "me") || g.leading() != mine {
			t.Fatalf("told it is gone itself: members %v, leading %d (was %d)", members, g.leading(), mine)
		}
	}
}

// A resign told on this member's own channel is believed from any member,
// whatever this member's last assignment says of the key: a key resigned
// three times within one interval comes back to this member from a member
// its assignment names neither as the owner nor as the owner's successor
// (TestGroupResignedThriceWithinARound on a real server). The group's copy
// of such a resign is still dropped (it may be old news), and so is a
// message on this member's channel that names another member.
func TestScriptedDirectResignFromAnyMember(t *testing.T) {
	g, keys := scripted(t, 12, func(c *Config) { c.Identity = "b" })
	w := newScriptWire("a", "b", "c")
	if err := g.round(context.Background(), w, scanRound); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	// A key a owns whose successor is b: c is neither.
	var k tag
	for _, key := range keys {
		if kt := tagOf(key); assignedTo(g, kt) == "a" && successorOf(kt, g.st.assigned, "a") == "b" {
			k = kt
			break
		}
	}
	g.st.pids = map[uint32]string{7: "a", 8: "c"}
	g.mu.Unlock()
	if k == (tag{}) {
		t.Fatal("no key of a's has b for its successor")
	}
	for _, tc := range []struct {
		name     string
		channel  string
		to       string
		wantHold string
		wantGift bool
	}{
		{name: "the group's copy", channel: g.channel, to: "a"},
		{name: "on this member's channel, naming another", channel: g.myChannel, to: "a"},
		{name: "on this member's channel, naming it", channel: g.myChannel, to: "b", wantHold: "c", wantGift: true},
	} {
		g.mu.Lock()
		if g.st.owns(k, "c") {
			g.mu.Unlock()
			t.Fatalf("%s: this member's assignment says c owns %v", tc.name, k)
		}
		g.st.keys[k].hold, g.st.keys[k].gift = resignHold{member: "b", until: time.Now().Add(time.Minute)}, false
		g.mu.Unlock()
		msg := lockconn.EncodeGroup(lockconn.GroupMessage{Kind: lockconn.GroupResigned, Member: "c", Key: k, To: tc.to})
		g.heard(&pgconn.Notification{PID: 8, Channel: tc.channel, Payload: msg}, 4242)
		g.mu.Lock()
		gift, hold := g.st.keys[k].gift, g.st.keys[k].hold.member
		g.mu.Unlock()
		if tc.wantHold == "" {
			tc.wantHold = "b" // this member's own hold, as it was
		}
		if gift != tc.wantGift || hold != tc.wantHold {
			t.Errorf("%s: gift %v, held from %q; want gift %v, held from %q", tc.name, gift, hold, tc.wantGift, tc.wantHold)
		}
	}
}

// On a Direct session a full round without a scan is a ping (no
// statement, so no transaction whose end walks every lock the session
// holds), and renews the trust window as the check does; a scan round
// still scans, which proves each key by its lock again.
func TestScriptedDirectFullRoundPings(t *testing.T) {
	g, keys, w, demoted := leadingThree(t)
	ctx := context.Background()
	w.mu.Lock()
	w.direct = true
	checks, scans := w.calls["check"], w.calls["scan"]
	w.mu.Unlock()
	old := time.Now().Add(time.Second)
	g.mu.Lock()
	g.st.trustEnd = old
	g.mu.Unlock()
	if err := g.round(ctx, w, fullRound); err != nil {
		t.Fatal(err)
	}
	if w.count("ping") != 1 || w.count("check") != checks || w.count("scan") != scans {
		t.Fatalf("a full round on a Direct session: %d pings, %d checks, %d scans; want one ping alone", w.count("ping"), w.count("check")-checks, w.count("scan")-scans)
	}
	g.mu.Lock()
	renewed := g.st.trustEnd.After(old)
	g.mu.Unlock()
	if !renewed || g.leading() != 3 {
		t.Fatalf("the ping did not renew the trust window (renewed %v, leading %d)", renewed, g.leading())
	}
	w.mu.Lock()
	delete(w.held, tagOf(keys[0]))
	w.mu.Unlock()
	if err := g.round(ctx, w, scanRound); err != nil {
		t.Fatal(err)
	}
	if w.count("ping") != 1 || w.count("scan") != scans+1 {
		t.Fatalf("a scan round on a Direct session: %d pings, %d scans; want the scan", w.count("ping"), w.count("scan")-scans)
	}
	demotedWith(t, demoted, leader.ErrLockLost, "the scan did not find the key's lock gone")
}
