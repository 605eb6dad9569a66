package pgleadertest_test

import (
	"context"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/leader"
	"github.com/pgleader/pgleader/pgleadertest"
)

var shared pgleadertest.Shared

func TestMain(m *testing.M) {
	code := pgleadertest.Main(m, &shared)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			println(err.Error())
			code = 1
		}
	}
	os.Exit(code)
}

// What a user's failover test does: two electors, the leader's backend
// terminated, the other one elected; then the server restarted, and a
// leader again.
func TestFailoverHelpers(t *testing.T) {
	srv := shared.Get(t)
	key := leader.KeyFromName(t.Name())
	elected := make(chan string, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	defer func() { cancel(); <-done; <-done }()
	for _, id := range []string{"a", "b"} {
		e, err := elector.New(elector.Config{
			Connect: elector.DSN(srv.DSN()), Key: key, Identity: id,
			RenewInterval: 100 * time.Millisecond, RenewDeadline: 300 * time.Millisecond, LeaseDuration: time.Second,
			Callbacks: elector.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) {
				elected <- id
				<-ctx.Done()
			}},
		})
		if err != nil {
			t.Fatal(err)
		}
		go func() { e.Run(ctx); done <- struct{}{} }()
	}
	next := func() string {
		select {
		case id := <-elected:
			return id
		case <-time.After(30 * time.Second):
			t.Fatal("no election")
			return ""
		}
	}
	first := next()
	gone, err := srv.TerminateLeader(ctx, key)
	if err != nil || gone != first {
		t.Fatalf("TerminateLeader: %q, %v; want %q", gone, err, first)
	}
	if second := next(); second == first {
		// The other elector is queued on the lock (an heir), so it takes
		// over at once, before the terminated one has reconnected.
		t.Fatalf("%s elected again after its backend was terminated", second)
	}
	if err := srv.Restart(context.Background(), pgleadertest.Fast); err != nil {
		t.Fatal(err)
	}
	next()
	if n, err := srv.TerminateBackend(ctx, "nobody"); n != 0 || err != nil {
		t.Fatalf("TerminateBackend(nobody): %d, %v", n, err)
	}
}
