package elector_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/leader"
)

// scriptLease stands in for PostgreSQL: each campaign round and each
// confirm answers the next scripted step. Past the script, a campaign round
// waits out its context and reads as Busy, and a confirm succeeds.
type scriptLease struct {
	noHandover
	mu        sync.Mutex
	campaigns []step
	confirms  []step
	renews    []error
	calls     []string
	// idle, when set, is the round past the campaigns script (default: a
	// Busy round with the lock held by "someone").
	idle *lockconn.Round
	// requests, when set, are what a leader's idle reads return.
	requests chan lockconn.Request
}

type step struct {
	round lockconn.Round
	term  int64
	err   error
	// sentAgo: the round was sent this long before it returns (an heir's
	// lock wait granted late).
	sentAgo time.Duration
}

func (s *scriptLease) record(call string) {
	s.mu.Lock()
	s.calls = append(s.calls, call)
	s.mu.Unlock()
}

func (s *scriptLease) count(call string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.calls {
		if c == call {
			n++
		}
	}
	return n
}

func (s *scriptLease) next(q *[]step) (step, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(*q) == 0 {
		return step{}, false
	}
	st := (*q)[0]
	*q = (*q)[1:]
	return st, true
}

func (s *scriptLease) PID() uint32 { return 4242 }

func (s *scriptLease) Campaign(ctx context.Context, t *lockconn.Target, try bool) (lockconn.Round, error) {
	s.record("campaign")
	if st, ok := s.next(&s.campaigns); ok {
		if st.sentAgo > 0 {
			st.round.Sent = time.Now().Add(-st.sentAgo)
		}
		return st.round, st.err
	}
	select {
	case <-ctx.Done():
		return lockconn.Round{}, ctx.Err()
	case <-time.After(10 * time.Millisecond):
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.idle != nil {
			return *s.idle, nil
		}
		return lockconn.Round{Busy: true, Holder: "someone", HolderPID: 1}, nil
	}
}

func (s *scriptLease) Confirm(ctx context.Context, t *lockconn.Target) (int64, error) {
	s.record("confirm")
	if st, ok := s.next(&s.confirms); ok {
		if errors.Is(st.err, lockconn.ErrTermBusy) {
			time.Sleep(20 * time.Millisecond) // the server's lock_timeout on the term row
		}
		return st.term, st.err
	}
	return 1, nil
}

func (s *scriptLease) RenewSession(ctx context.Context, t *lockconn.Target) error {
	return s.Renew(ctx, t)
}

func (s *scriptLease) Renew(ctx context.Context, t *lockconn.Target) error {
	s.record("renew")
	if err := ctx.Err(); err != nil {
		return err // a statement sent with a deadline already past fails at once
	}
	return s.nextRenew()
}

// Announce is a renew that also notifies followers; it takes its answer
// from the renews script too.
func (s *scriptLease) Announce(ctx context.Context, t *lockconn.Target) error {
	s.record("announce")
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.nextRenew()
}

// nextRenew pops the renews script's next answer (nil once it is empty).
func (s *scriptLease) nextRenew() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.renews) == 0 {
		return nil
	}
	err := s.renews[0]
	s.renews = s.renews[1:]
	return err
}

func (s *scriptLease) WaitIdle(ctx context.Context, t *lockconn.Target, until time.Time) (lockconn.Request, error) {
	select {
	case <-ctx.Done():
		return lockconn.Request{}, ctx.Err()
	case <-time.After(time.Until(until)):
		return lockconn.Request{}, nil
	case r := <-s.requests:
		return r, nil
	}
}

// Candidate finds no candidate standing (every rank is forged).
func (s *scriptLease) Candidate(context.Context, *lockconn.Target, uint32) (string, bool, error) {
	s.record("candidate")
	return "", false, nil
}

func (s *scriptLease) Record(context.Context, string, ...any) error { return nil }

func (s *scriptLease) ShortenWait(*lockconn.Target, time.Duration) {}

func (s *scriptLease) SendRank(context.Context, *lockconn.Target, uint32, lockconn.Rank) error {
	s.record("rank")
	return nil
}

func (s *scriptLease) Unlock(ctx context.Context, t *lockconn.Target) error {
	s.record("unlock")
	return nil
}

func (s *scriptLease) Close() { s.record("close") }

// scripted runs an elector on a scripted lease until stop is called.
type scripted struct {
	e       *elector.Elector
	ls      *scriptLease
	elected chan leader.Leadership
	logs    *observer.ObservedLogs
	done    chan error
	cancel  context.CancelFunc
}

func runScripted(t *testing.T, ls *scriptLease, edit func(*elector.Config)) *scripted {
	t.Helper()
	return runScriptedOn(t, ls, ls, edit)
}

// runScriptedOn is runScripted with the elector opening lease, which
// records its calls in ls.
func runScriptedOn(t *testing.T, ls *scriptLease, lease elector.Lease, edit func(*elector.Config)) *scripted {
	t.Helper()
	core, logs := observer.New(zap.DebugLevel)
	sc := &scripted{ls: ls, elected: make(chan leader.Leadership, 4), logs: logs, done: make(chan error, 1)}
	cfg := elector.Config{
		Connect: elector.DSN("postgres://u@127.0.0.1:1/db"), Key: leader.KeyFromName(t.Name()), Identity: "scripted",
		Logger:        zap.New(core),
		RenewInterval: 20 * time.Millisecond, RenewDeadline: 100 * time.Millisecond, LeaseDuration: 300 * time.Millisecond,
		Callbacks: elector.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) {
			sc.elected <- l
			<-ctx.Done()
		}},
	}
	if edit != nil {
		edit(&cfg)
	}
	e, err := elector.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	elector.UseLease(e, lease)
	sc.e = e
	ctx, cancel := context.WithCancel(context.Background())
	sc.cancel = cancel
	go func() { sc.done <- e.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-sc.done:
		case <-time.After(10 * time.Second):
			t.Error("Run did not return")
		}
	})
	return sc
}

// wideTrust widens a scripted elector's trust window from 100 ms to a
// second, for tests that fail on any demotion: under CI's load (-race
// beside the version matrix) the process itself was once not scheduled
// for 100 ms, which is the paused process the window exists for, not the
// behaviour under test. Renews still come every 20 ms.
func wideTrust(c *elector.Config) {
	c.RenewDeadline, c.LeaseDuration = time.Second, 3*time.Second
}

func (sc *scripted) waitElected(t *testing.T) leader.Leadership {
	t.Helper()
	select {
	case l := <-sc.elected:
		return l
	case <-time.After(10 * time.Second):
		t.Fatal("not elected")
		return leader.Leadership{}
	}
}

// A lock wait that ended in lock_timeout as the lock was granted leaves the
// session holding it; the next round finds it held and adopts it, with no
// new grant and no stacking.
func TestScriptedAdoptsGrantThatRacedTheTimeout(t *testing.T) {
	ls := &scriptLease{campaigns: []step{
		{round: lockconn.Round{Busy: true, Holder: "old-leader", HolderPID: 7}},
		{round: lockconn.Round{Already: true, Held: true}},
	}}
	sc := runScripted(t, ls, nil)
	sc.waitElected(t)
	if n := sc.logs.FilterMessage("the last lock wait timed out as the lock was granted; holding it").Len(); n != 1 {
		t.Fatalf("adoption logged %d times, want 1", n)
	}
	if sc.e.Leader() != "scripted" {
		t.Fatalf("Leader() = %q after the adoption", sc.e.Leader())
	}
}

// A lock already held by this backend with no timed-out round before it
// was taken by someone else on the same server connection: a
// transaction-pooling proxy. Run gives up.
func TestScriptedAlreadyHeldWithoutTimeoutIsPooling(t *testing.T) {
	ls := &scriptLease{campaigns: []step{{round: lockconn.Round{Already: true, Held: true}}}}
	sc := runScripted(t, ls, nil)
	select {
	case err := <-sc.done:
		sc.done <- err // for the cleanup
		if !errors.Is(err, leader.ErrTransactionPooling) {
			t.Fatalf("Run: %v, want ErrTransactionPooling", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run kept going")
	}
	select {
	case <-sc.elected:
		t.Fatal("elected on a shared backend")
	default:
	}
}

// A term row busy for a while (an earlier leader's fenced transaction
// still open): the elector keeps confirming, and is elected with the term
// once it is installed.
func TestScriptedTermBusyThenInstalled(t *testing.T) {
	ls := &scriptLease{
		campaigns: []step{{round: lockconn.Round{Held: true, Free: true}}},
		confirms:  []step{{err: lockconn.ErrTermBusy}, {err: lockconn.ErrTermBusy}, {term: 7}},
	}
	sc := runScripted(t, ls, func(c *elector.Config) { c.Fencing = elector.Fencing{Enabled: true} })
	l := sc.waitElected(t)
	if l.Term != 7 || ls.count("confirm") != 3 {
		t.Fatalf("term %d after %d confirms, want 7 after 3", l.Term, ls.count("confirm"))
	}
}

// A term row that stays busy past LeaseDuration: the elector gives the
// lock back (an unlock, not a dropped session), is not elected, and
// campaigns again.
func TestScriptedTermStuckReleasesAndCampaignsAgain(t *testing.T) {
	_, sc := termNeverInstalled(t, step{err: lockconn.ErrTermBusy})
	if sc.logs.FilterMessageSnippet("could not install the next fencing term").Len() == 0 {
		t.Fatal("no error logged for the stuck term")
	}
}

// A lock table that stays full past LeaseDuration at the term's
// installation (another role filled it; SQLSTATE 53200): the elector
// tries again every RenewInterval, not in a loop of refused statements,
// then gives the lock back (an unlock, not a closed session) with an
// Error, is not elected, and campaigns again.
func TestScriptedTermTableFullReleasesAndCampaignsAgain(t *testing.T) {
	ls, sc := termNeverInstalled(t, step{err: &pgconn.PgError{Code: "53200", Message: "out of shared memory"}})
	// 300 ms of LeaseDuration, a try every 20 ms: about 15.
	if n := ls.count("confirm"); n > 40 {
		t.Fatalf("%d term installations tried before the unlock; want about one per RenewInterval", n)
	}
	if n := ls.count("close"); n != 0 {
		t.Fatalf("the session was closed %d times; want the lock given back on it", n)
	}
	if sc.logs.FilterMessageSnippet("lock table stayed full").Len() == 0 {
		t.Fatal("no error logged for the full lock table")
	}
}

// Run's context ends while a full lock table keeps the first term from
// being installed (a LeaseDuration of a minute): Run returns at once, not
// when the elector gives up on the term.
func TestScriptedTermTableFullStopsAtOnce(t *testing.T) {
	ls := failingConfirms(step{err: &pgconn.PgError{Code: "53200", Message: "out of shared memory"}})
	sc := runScripted(t, ls, func(c *elector.Config) {
		c.Fencing = elector.Fencing{Enabled: true}
		c.LeaseDuration, c.RenewDeadline = time.Minute, 20*time.Second
	})
	eventually(t, "two term installations tried", func() (bool, string) {
		return ls.count("confirm") >= 2, fmt.Sprint(ls.count("confirm"))
	})
	sc.cancel()
	select {
	case err := <-sc.done:
		sc.done <- err // for the cleanup's wait
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return within 5 s of its context's end while the term waited for room")
	}
}

// failingConfirms scripts a lock won at the first campaign whose every
// term installation (a thousand) fails with fail.
func failingConfirms(fail step) *scriptLease {
	fails := make([]step, 1000)
	for i := range fails {
		fails[i] = fail
	}
	return &scriptLease{campaigns: []step{{round: lockconn.Round{Held: true, Free: true}}}, confirms: fails}
}

// termNeverInstalled runs a fenced elector that wins the lock at once and
// whose every term installation fails with fail, until it gives the lock
// back and campaigns again, never elected.
func termNeverInstalled(t *testing.T, fail step) (*scriptLease, *scripted) {
	t.Helper()
	ls := failingConfirms(fail)
	sc := runScripted(t, ls, func(c *elector.Config) { c.Fencing = elector.Fencing{Enabled: true} })
	eventually(t, "an unlock and a new campaign", func() (bool, string) {
		return ls.count("unlock") > 0 && ls.count("campaign") >= 2,
			fmt.Sprintf("%d unlocks, %d campaigns", ls.count("unlock"), ls.count("campaign"))
	})
	select {
	case <-sc.elected:
		t.Fatal("elected without a term")
	default:
	}
	return ls, sc
}

// An heir's lock wait granted late (a loaded machine): the round that won
// was sent more than the trust window ago, so the window it opened has
// closed by the time it returns. The elector checks the lock once more,
// which opens a fresh window, before OnElected, and leads on; it does not
// start OnElected untrusted and demote itself at its first renew, which
// would hand a lock it holds to the next heir (a churn that kept a loaded
// fleet leaderless for seconds).
func TestScriptedLateGrantConfirmsBeforeLeading(t *testing.T) {
	ls := &scriptLease{campaigns: []step{{round: lockconn.Round{Held: true, Proven: true}, sentAgo: 1500 * time.Millisecond}}}
	var trustedAtStart bool
	var once sync.Once
	sc := runScripted(t, ls, func(c *elector.Config) {
		wideTrust(c)
		inner := c.Callbacks.OnElected
		c.Callbacks.OnElected = func(ctx context.Context, l leader.Leadership) {
			once.Do(func() { trustedAtStart = ctxTrusted(ctx) })
			inner(ctx, l)
		}
	})
	sc.waitElected(t)
	if !trustedAtStart {
		t.Fatal("OnElected started with its context already cancelled")
	}
	eventually(t, "five renews as the leader", func() (bool, string) {
		return ls.count("renew") >= 5 || sc.logs.FilterMessage("demoted").Len() > 0, fmt.Sprintf("%d renews", ls.count("renew"))
	})
	if !sc.e.IsLeader() || sc.logs.FilterMessage("demoted").Len() != 0 {
		t.Fatalf("IsLeader %v, %d demotions after a late grant", sc.e.IsLeader(), sc.logs.FilterMessage("demoted").Len())
	}
	// Only a check may open the fresh window: the lock is proven again.
	if n := ls.count("confirm"); n != 1 {
		t.Fatalf("%d confirms after a late grant, want 1", n)
	}
}

// ctxTrusted reports whether OnElected's context is still live.
func ctxTrusted(ctx context.Context) bool { return ctx.Err() == nil }

// noHandover is a lease that gets no resign requests and keeps no values:
// what a fake of the core lease embeds.
type noHandover struct{}

func (noHandover) Proclaim(context.Context, *lockconn.Target, string, string, []byte) error {
	return nil
}
func (noHandover) ReadValue(context.Context, string, string) (lockconn.Value, error) {
	return lockconn.Value{}, nil
}

func (noHandover) Requester(context.Context, uint32, []string) (string, bool, bool, error) {
	return "", false, false, nil
}
func (noHandover) Reply(context.Context, uint32, string) error { return nil }
func (noHandover) Standing(context.Context, *lockconn.Target, string) (bool, error) {
	return false, nil
}
func (noHandover) Precede(context.Context, *lockconn.Target, string) (bool, bool, error) {
	return false, false, nil
}
func (noHandover) Reserve(context.Context, *lockconn.Target, string, time.Duration) error {
	return nil
}
func (noHandover) Unreserve(context.Context, *lockconn.Target, string, time.Duration) (string, error) {
	return "", nil
}
func (noHandover) DropReservation(context.Context, *lockconn.Target, string) error {
	return nil
}

func (noHandover) ShortenWait(*lockconn.Target, time.Duration) {}

func (noHandover) SendRank(context.Context, *lockconn.Target, uint32, lockconn.Rank) error {
	return nil
}
func (noHandover) Candidate(context.Context, *lockconn.Target, uint32) (string, bool, error) {
	return "", false, nil
}

// A round that finds the known leader's backend without its name (the
// lookup's activity snapshot missed it) keeps that leader; one that finds
// another, nameless backend holding the lock reports no leader; neither
// ever reports a made-up name.
func TestScriptedNamelessHolder(t *testing.T) {
	ls := &scriptLease{campaigns: []step{{round: lockconn.Round{Busy: true, Holder: "real-leader", HolderPID: 7}}},
		idle: &lockconn.Round{Busy: true, HolderPID: 7}}
	sc := runScripted(t, ls, nil)
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(waitLong)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: Leader() = %q", what, sc.e.Leader())
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitFor("the named round", func() bool { return sc.e.Leader() == "real-leader" })
	n := ls.count("campaign")
	waitFor("nameless rounds", func() bool { return ls.count("campaign") >= n+3 })
	if l := sc.e.Leader(); l != "real-leader" {
		t.Fatalf("Leader() = %q after nameless lookups of the leader's own backend, want real-leader", l)
	}
	ls.mu.Lock()
	ls.idle = &lockconn.Round{Busy: true, HolderPID: 8}
	ls.mu.Unlock()
	waitFor("a nameless backend holds the lock: no leader", func() bool { return sc.e.Leader() == "" })
}

// A lock table another role filled refuses the new leader's announcement
// (its NOTIFY's commit needs a slot there), after the check in front of it
// proved the lock: the leader leads on, and announces itself again later,
// paced (each refusal is an ERROR in the server's log), until it goes out.
func TestScriptedAnnouncementRefusedByAFullTable(t *testing.T) {
	full := fmt.Errorf("%w: the leader was not announced: %w", lockconn.ErrLockTableFull, &pgconn.PgError{Severity: "ERROR", Code: "53200", Message: "out of shared memory"})
	ls := &scriptLease{campaigns: []step{{round: lockconn.Round{Held: true, Free: true}}}, renews: []error{full}}
	sc := runScripted(t, ls, wideTrust)
	sc.waitElected(t)
	eventually(t, "the announcement sent again", func() (bool, string) {
		return ls.count("announce") >= 2, fmt.Sprintf("%d announcements, %d renews", ls.count("announce"), ls.count("renew"))
	})
	if n := sc.logs.FilterMessage("demoted").Len(); n != 0 || !sc.e.IsLeader() {
		t.Fatalf("%d demotions, IsLeader %v after a refused announcement", n, sc.e.IsLeader())
	}
	ls.mu.Lock()
	var between, announces int
	for _, c := range ls.calls {
		switch {
		case c == "announce":
			announces++
		case c == "renew" && announces == 1:
			between++
		}
	}
	ls.mu.Unlock()
	if between < 3 {
		t.Fatalf("%d renews between the refused announcement and the next try: it is not paced", between)
	}
	if n := sc.logs.FilterMessageSnippet("announcement was not sent").Len(); n != 1 {
		t.Fatalf("the refusal logged %d times, want 1", n)
	}
	waitRenews := ls.count("renew") + 3
	eventually(t, "renews without announcements once one went out", func() (bool, string) {
		return ls.count("renew") >= waitRenews, ""
	})
	if n := ls.count("announce"); n != 2 {
		t.Fatalf("%d announcements, want 2 (once one went out, no more)", n)
	}
}

// A flood of forged ranks from many sessions, each above the leader's
// own: the leader proves at most 5 a second (the resign requests'
// budget), leads on, and keeps no more than 256 of them.
func TestScriptedRankFloodIsBounded(t *testing.T) {
	ls := &scriptLease{campaigns: []step{{round: lockconn.Round{Held: true, Free: true}}}, requests: make(chan lockconn.Request)}
	sc := runScripted(t, ls, wideTrust)
	sc.waitElected(t)
	began := time.Now()
	for pid := uint32(1000); pid < 1400; pid++ {
		ls.requests <- lockconn.Request{PID: pid, Rank: &lockconn.Rank{Priority: int(pid)}}
	}
	took := time.Since(began)
	proofs := ls.count("candidate")
	if most := 5 + int(5*took.Seconds()) + 1; proofs > most {
		t.Fatalf("%d proofs for 400 forged ranks in %s, want at most %d", proofs, took, most)
	}
	if n := len(sc.e.Status().Candidates); n > 256 {
		t.Fatalf("%d ranks kept, want at most 256", n)
	}
	if !sc.e.IsLeader() || sc.logs.FilterMessage("demoted").Len() != 0 {
		t.Fatal("the flood ended the tenure")
	}
}

// A leader that leaves hands over to a ranked candidate only when it ranks
// above an unranked one (which tells no rank, and may stand): a candidate
// of priority -1 gets no handover.
func TestScriptedLeavingSkipsALowRank(t *testing.T) {
	ls := &scriptLease{campaigns: []step{{round: lockconn.Round{Held: true, Free: true}}}, requests: make(chan lockconn.Request)}
	sc := runScripted(t, ls, wideTrust)
	sc.waitElected(t)
	ls.requests <- lockconn.Request{PID: 77, Rank: &lockconn.Rank{Priority: -1}}
	ls.requests <- lockconn.Request{PID: 78, Rank: &lockconn.Rank{Priority: -2}} // the first one is recorded
	if !slices.ContainsFunc(sc.e.Status().Candidates, func(c elector.RankedCandidate) bool { return c.PID == 77 }) {
		t.Fatalf("the first rank is not recorded: %+v", sc.e.Status().Candidates)
	}
	if err := sc.e.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the step-down", func() (bool, string) { return ls.count("unlock") > 0, "" })
	if n := ls.count("candidate"); n != 0 {
		t.Fatalf("%d proofs of a candidate below the default rank: a leaving leader handed over to it", n)
	}
}

// A ranked candidate whose round won tells no rank before OnElected: a
// plain round reports the holder it saw at its start and the grant it got
// at its end, and a rank told to that old leader (it changed since the
// last round) was a round trip on the handover's path, to a session that
// had just let go of the lock.
func TestScriptedWinTellsNoRank(t *testing.T) {
	ls := &scriptLease{campaigns: []step{
		{round: lockconn.Round{Busy: true, Holder: "old", HolderPID: 77}},
		{round: lockconn.Round{Held: true, Proven: true, Holder: "old", HolderPID: 78}},
	}}
	sc := runScripted(t, ls, func(c *elector.Config) { c.Priority = 1 })
	sc.waitElected(t)
	ls.mu.Lock()
	calls := slices.Clone(ls.calls)
	ls.mu.Unlock()
	want := []string{"campaign", "rank", "campaign"}
	if len(calls) < 3 || !slices.Equal(calls[:3], want) || len(calls) > 3 && calls[3] == "rank" {
		t.Fatalf("calls %v: want %v, then no rank before leading", calls, want)
	}
}

// A ranked candidate tells a leader its rank on first seeing it and once
// more 1 s later, whatever the ranks (a leader listens only from its first
// renew on, and one that leaves hands over to the best rank it heard, even
// below its own), and then again (2 s later, then 4 s, ...) only while the
// leader's own application_name says it prefers the candidate to itself:
// a rank sent before the new leader listened, or lost, is not lost for
// good, and a candidate the leader would not hand over to costs it
// nothing more.
func TestScriptedRankToldAgainOnlyWhileOutranking(t *testing.T) {
	for _, tt := range []struct {
		name, holder string
		again        bool
	}{
		{"an unranked leader", "the-leader", true},
		{"a leader of a lower priority", "the-leader [P0]", true},
		{"a leader of the same priority", "the-leader [P1]", false},
		{"a leader of a higher priority", "the-leader [P2]", false},
		{"a newer leader under NewestVersion", "the-leader [N0 2.0.0]", false},
		{"an older leader under NewestVersion", "the-leader [N5 1.0.0]", true},
		{"an older leader under OldestVersion", "the-leader [O0 1.0.0]", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ls := &scriptLease{idle: &lockconn.Round{Busy: true, Holder: tt.holder, HolderPID: 7}}
			sc := runScripted(t, ls, func(c *elector.Config) { c.Priority, c.Version = 1, "1.5.0" })
			eventually(t, "the first rank", func() (bool, string) { return ls.count("rank") == 1, "" })
			if got := sc.e.Leader(); got != "the-leader" {
				t.Fatalf("Leader() = %q, want the identity without its rank", got)
			}
			began := time.Now()
			eventually(t, "the rank told a second time", func() (bool, string) { return ls.count("rank") >= 2, "" })
			if tt.again {
				eventually(t, "the rank told a third time", func() (bool, string) { return ls.count("rank") >= 3, "" })
				return
			}
			// The third would be due 2 s after the second, 3 s after the
			// first.
			eventually(t, "rounds for 3.5 s", func() (bool, string) { return time.Since(began) > 3500*time.Millisecond, "" })
			if n := ls.count("rank"); n != 2 {
				t.Fatalf("the rank told %d times to a leader that does not prefer this candidate, want twice", n)
			}
		})
	}
}
