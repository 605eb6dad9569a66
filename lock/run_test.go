package lock_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/leader"
	"github.com/pgleader/pgleader/lock"
)

const waitLong = 30 * time.Second

// childMain: role "tryrun" waits for "go" on stdin, then calls TryRun; its
// fn reports "running" and holds the lock until "finish" arrives.
func childMain(role string) int {
	em := testpg.NewEmitter(os.Stdout)
	if role != "tryrun" {
		fmt.Fprintf(os.Stderr, "unknown role %q\n", role)
		return 2
	}
	lines := make(chan string, 4)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	em.Emit(testpg.Event{Ev: "started"})
	if <-lines != "go" {
		return 2
	}
	err := lock.TryRun(context.Background(), leader.DSN(os.Getenv("CHILD_DSN")), leader.KeyFromName(os.Getenv("CHILD_KEY")),
		lock.Options{Identity: os.Getenv("CHILD_ID")}, func(ctx context.Context) error {
			em.Emit(testpg.Event{Ev: "running"})
			<-lines // "finish", or stdin closed
			return nil
		})
	switch {
	case err == nil:
		em.Emit(testpg.Event{Ev: "ran"})
	case errors.Is(err, lock.ErrHeld):
		em.Emit(testpg.Event{Ev: "skipped", Data: err.Error()})
	default:
		em.Emit(testpg.Event{Ev: "error", Err: err.Error()})
	}
	return 0
}

// 20 concurrent runners with their own connections: exactly one runs the
// job, the others are told it is held, and by whom.
func TestTryRunExactlyOnceGoroutines(t *testing.T) {
	dsn := server(t).DSN()
	key := leader.KeyFromName(t.Name())
	const n = 20
	var ran, skipped atomic.Int32
	allSkipped := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := lock.TryRun(context.Background(), leader.DSN(dsn), key, lock.Options{Identity: fmt.Sprintf("runner-%d", i)},
				func(ctx context.Context) error {
					ran.Add(1)
					select { // hold the lock until every other runner has tried
					case <-allSkipped:
					case <-time.After(waitLong):
					}
					return nil
				})
			if errors.Is(err, lock.ErrHeld) {
				var he *lock.HeldError
				if !errors.As(err, &he) || !strings.HasPrefix(he.Holder.Identity, "runner-") {
					errs <- fmt.Errorf("skipped without the holder: %v", err)
				}
				if skipped.Add(1) == n-1 {
					close(allSkipped)
				}
				return
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if ran.Load() != 1 || skipped.Load() != n-1 {
		t.Fatalf("ran %d, skipped %d; want 1 and %d", ran.Load(), skipped.Load(), n-1)
	}
}

// The same with 20 separate processes.
func TestTryRunExactlyOnceProcesses(t *testing.T) {
	dsn := server(t).DSN()
	key := leader.KeyFromName(t.Name())
	const n = 20
	kids := make([]*testpg.Child, n)
	for i := range kids {
		kids[i] = testpg.StartChild(t, "tryrun", "CHILD_DSN="+dsn, "CHILD_KEY="+key.Name(), fmt.Sprintf("CHILD_ID=proc-%d", i))
	}
	for _, k := range kids {
		if _, err := k.WaitTimeout("started", waitLong); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range kids {
		k.Send("go")
	}
	// Every child reports either running (then ran) or skipped.
	outcome := make(chan string, n)
	for _, k := range kids {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), waitLong)
			defer cancel()
			e, err := k.WaitAny(ctx, "running", "skipped", "error")
			if err != nil {
				outcome <- err.Error()
				return
			}
			outcome <- e.Ev + e.Err
		}()
	}
	counts := map[string]int{}
	for i := 0; i < n; i++ {
		counts[<-outcome]++
	}
	if counts["running"] != 1 || counts["skipped"] != n-1 {
		t.Fatalf("outcomes %v; want 1 running and %d skipped", counts, n-1)
	}
	for _, k := range kids {
		k.Send("finish")
	}
	for _, k := range kids {
		<-k.Done()
	}
	ranCount := 0
	for _, k := range kids {
		for _, e := range k.Log() {
			if e.Ev == "ran" {
				ranCount++
			}
		}
	}
	if ranCount != 1 {
		t.Fatalf("%d processes ran the job", ranCount)
	}
}

// The lock is released on return, on error and on panic.
func TestTryRunReleases(t *testing.T) {
	dsn := server(t).DSN()
	key := leader.KeyFromName(t.Name())
	c := leader.DSN(dsn)
	ctx := context.Background()
	boom := errors.New("boom")
	if err := lock.TryRun(ctx, c, key, lock.Options{}, func(context.Context) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("want fn's error, got %v", err)
	}
	func() {
		defer func() {
			if r := recover(); r != "kaboom" {
				t.Fatalf("panic not re-raised: %v", r)
			}
		}()
		lock.TryRun(ctx, c, key, lock.Options{}, func(context.Context) error { panic("kaboom") })
	}()
	ran := false
	if err := lock.TryRun(ctx, c, key, lock.Options{}, func(context.Context) error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("after an error and a panic the lock should be free: ran=%v err=%v", ran, err)
	}
	h, err := leader.Holder(ctx, conn(t), key)
	if err != nil || h.Held {
		t.Fatalf("lock still held: %+v %v", h, err)
	}
}

// When the connection is lost while fn runs, fn's context is cancelled and
// TryRun reports it.
func TestTryRunCancelsOnConnectionLoss(t *testing.T) {
	s := server(t)
	key := leader.KeyFromName(t.Name())
	started := make(chan struct{})
	var cause error
	done := make(chan error, 1)
	go func() {
		done <- lock.TryRun(context.Background(), leader.DSN(s.DSN()), key, lock.Options{Identity: "doomed-job", CheckInterval: 100 * time.Millisecond},
			func(ctx context.Context) error {
				close(started)
				<-ctx.Done()
				cause = context.Cause(ctx)
				return ctx.Err()
			})
	}()
	waitFor(t, started, "fn")
	if n, err := s.TerminateBackend(context.Background(), "doomed-job"); err != nil || n != 1 {
		t.Fatalf("terminate: %d %v", n, err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, leader.ErrConnectionLost) || !errors.Is(cause, leader.ErrConnectionLost) {
			t.Fatalf("want ErrConnectionLost, got %v (cause %v)", err, cause)
		}
	case <-time.After(waitLong):
		t.Fatal("fn not cancelled after the connection was lost")
	}
}

// With Wait, a runner waits for the lock and runs once it is released.
func TestTryRunWait(t *testing.T) {
	dsn := server(t).DSN()
	key := leader.KeyFromName(t.Name())
	holding := make(chan struct{})
	release := make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- lock.TryRun(context.Background(), leader.DSN(dsn), key, lock.Options{}, func(context.Context) error {
			close(holding)
			<-release
			return nil
		})
	}()
	waitFor(t, holding, "the first runner")
	if err := lock.TryRun(context.Background(), leader.DSN(dsn), key, lock.Options{Wait: 50 * time.Millisecond},
		func(context.Context) error { return nil }); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("short wait: want ErrLockHeld, got %v", err)
	}
	second := make(chan error, 1)
	go func() {
		second <- lock.TryRun(context.Background(), leader.DSN(dsn), key, lock.Options{Wait: waitLong}, func(context.Context) error { return nil })
	}()
	close(release)
	if err := waitFor(t, first, "the first runner"); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(t, second, "the second runner"); err != nil {
		t.Fatalf("waiting runner: %v", err)
	}
}

// TryRun's trust window is half its lease: behind a black hole, fn's
// context ends about LeaseDuration/2 after the last good check, well
// before the server frees the lock (LeaseDuration), so a second runner
// never starts while the first still believes it holds the lock.
func TestTryRunBlackholedStopsBeforeTheLease(t *testing.T) {
	srv, proxy := proxied(t)
	key := leader.KeyFromName(t.Name())
	const lease = 3 * time.Second
	started, cancelled := make(chan struct{}), make(chan time.Time, 1)
	first := make(chan error, 1)
	go func() {
		first <- lock.TryRun(context.Background(), leader.DSN(proxy.DSN()), key,
			lock.Options{Identity: "holed-runner", CheckInterval: 100 * time.Millisecond, LeaseDuration: lease},
			func(ctx context.Context) error {
				close(started)
				<-ctx.Done()
				cancelled <- time.Now()
				return nil
			})
	}()
	waitFor(t, started, "the first runner's fn")
	holed := time.Now()
	proxy.Blackhole()
	secondRan := make(chan time.Time, 1)
	second := make(chan error, 1)
	go func() {
		second <- lock.TryRun(context.Background(), leader.DSN(srv.DSN()), key, lock.Options{Identity: "second-runner", Wait: 30 * time.Second},
			func(ctx context.Context) error { secondRan <- time.Now(); return nil })
	}()
	stop := waitFor(t, cancelled, "the first runner's cancellation")
	if took := stop.Sub(holed); took > lease/2+400*time.Millisecond {
		t.Fatalf("fn's context ended %s after the path went silent; its trust window is LeaseDuration/2 = %s", took, lease/2)
	}
	if ran := waitFor(t, secondRan, "the second runner"); !ran.After(stop) {
		t.Fatalf("the second runner started %s before the first one's fn was cancelled", stop.Sub(ran))
	}
	if err := waitFor(t, first, "the first TryRun"); !errors.Is(err, leader.ErrRenewDeadline) && !errors.Is(err, leader.ErrConnectionLost) {
		t.Fatalf("first TryRun: %v, want the lost lock", err)
	}
	if err := waitFor(t, second, "the second TryRun"); err != nil {
		t.Fatal(err)
	}
	proxy.Heal()
}

// waitFor receives from ch within a minute, or fails the test.
func waitFor[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Minute):
		t.Fatalf("no %s within a minute", what)
		var zero T
		return zero
	}
}

// TryRun's trust window counts from when a successful check was sent, not
// from when its reply came: with replies 400 ms late, fn's context must end
// about LeaseDuration/2 - 400 ms after the path goes silent, not
// LeaseDuration/2. Both for the first check (the confirm before fn runs)
// and for a renew while fn runs.
func TestTryRunTrustWindowFromSend(t *testing.T) {
	for _, afterRenew := range []bool{false, true} {
		t.Run(map[bool]string{false: "first check", true: "a renew"}[afterRenew], func(t *testing.T) {
			trustWindowFromSend(t, afterRenew)
		})
	}
}

func trustWindowFromSend(t *testing.T, afterRenew bool) {
	_, proxy := proxied(t)
	const lease, delay = 3 * time.Second, 400 * time.Millisecond
	started, cancelled := make(chan time.Time, 1), make(chan time.Time, 1)
	done := make(chan error, 1)
	proxy.DelayReplies(delay)
	go func() {
		done <- lock.TryRun(context.Background(), leader.DSN(proxy.DSN()), leader.KeyFromName(t.Name()),
			lock.Options{Identity: "slow-path", CheckInterval: time.Second, LeaseDuration: lease},
			func(ctx context.Context) error {
				started <- time.Now()
				<-ctx.Done()
				cancelled <- time.Now()
				return nil
			})
	}()
	waitFor(t, started, "fn")
	if afterRenew {
		// The first renew's reply (a second later) comes through: the
		// session's only traffic while fn runs.
		before := proxy.ReadsDown.Load()
		for deadline := time.Now().Add(waitLong); proxy.ReadsDown.Load() == before; {
			if time.Now().After(deadline) {
				t.Fatal("no renew reply while fn ran")
			}
			time.Sleep(time.Millisecond)
		}
	}
	holed := time.Now()
	proxy.Blackhole()
	stop := waitFor(t, cancelled, "the cancellation")
	if took := stop.Sub(holed); took > lease/2-delay+200*time.Millisecond {
		t.Fatalf("fn's context ended %s after the path went silent; the last check was sent %s before its reply, so the window (%s) closed %s after", took, delay, lease/2, lease/2-delay)
	}
	waitFor(t, done, "TryRun")
	proxy.Heal()
}

// A TryRun whose server answers late (its session alive, a check not
// answered within the trust window) cancels fn when the window closes,
// but keeps its session, and so the lock, until fn has returned: closing
// it at once would let a second TryRun run fn while the first one's fn
// still works (here for 1.5 s after its context's end). The first TryRun
// reports the lapse (ErrRenewDeadline), though its late check did answer
// and the later ones come in time.
func TestTryRunLateCheckKeepsLockUntilFnReturns(t *testing.T) {
	srv, proxy := proxied(t)
	key := leader.KeyFromName(t.Name())
	started, cancelled, returned := make(chan struct{}), make(chan struct{}), make(chan time.Time, 1)
	first := make(chan error, 1)
	go func() {
		first <- lock.TryRun(context.Background(), leader.DSN(proxy.DSN()), key,
			lock.Options{Identity: "slow", CheckInterval: 100 * time.Millisecond, LeaseDuration: time.Second},
			func(ctx context.Context) error {
				close(started)
				<-ctx.Done()
				close(cancelled)
				time.Sleep(1500 * time.Millisecond) // a slow drain
				returned <- time.Now()
				return nil
			})
	}()
	waitFor(t, started, "fn")
	// A few checks through (the first use of a statement is two round
	// trips; slowed, its answer would come after fn returned).
	before := proxy.ReadsDown.Load()
	for deadline := time.Now().Add(waitLong); proxy.ReadsDown.Load() < before+3; {
		if time.Now().After(deadline) {
			t.Fatal("no checks while fn ran")
		}
		time.Sleep(time.Millisecond)
	}
	proxy.DelayReplies(700 * time.Millisecond) // past the 500 ms window
	secondAt := make(chan time.Time, 1)
	second := make(chan error, 1)
	go func() {
		second <- lock.TryRun(context.Background(), leader.DSN(srv.DSN()), key,
			lock.Options{Identity: "second", Wait: waitLong},
			func(ctx context.Context) error {
				secondAt <- time.Now()
				return nil
			})
	}()
	// The window closed (fn cancelled): the check in flight still answers
	// late, and the path is fast again after it, so that no check is in
	// flight when fn returns: the error must come from the late answer.
	waitFor(t, cancelled, "fn's cancellation")
	proxy.DelayReplies(0)
	if err := waitFor(t, first, "the first TryRun"); !errors.Is(err, leader.ErrRenewDeadline) {
		t.Fatalf("the first TryRun returned %v, want ErrRenewDeadline", err)
	}
	ret := waitFor(t, returned, "the first fn's return")
	if at := waitFor(t, secondAt, "the second fn"); at.Before(ret) {
		t.Fatalf("the second fn ran %s before the first one returned", ret.Sub(at))
	}
	if err := waitFor(t, second, "the second TryRun"); err != nil {
		t.Fatal(err)
	}
}

// proxied returns the package's server and a proxy in front of it, closed
// when the test ends.
func proxied(t *testing.T) (*testpg.Server, *testpg.Proxy) {
	t.Helper()
	srv := server(t)
	proxy, err := testpg.NewProxy(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	return srv, proxy
}
