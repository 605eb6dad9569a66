package pgleadertest_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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
	// The other elector queues on the lock before the leader's backend
	// goes: until it does, the terminated one may win its own key back.
	waitQueued(t, srv, key)
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

// waitQueued waits until a session waits for key.
func waitQueued(t *testing.T, srv *pgleadertest.Server, key leader.Key) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := srv.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	c, o, s := key.LockTag()
	for {
		var n int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
			AND classid = $1 AND objid = $2 AND objsubid = $3 AND NOT granted`, c, o, s).Scan(&n)
		if err != nil {
			t.Fatalf("no session queued on the key: %v", err)
		}
		if n > 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("no session queued on the key within 30s")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// On a PGLEADERTEST_DSN server (TestExternalServer has the rest),
// TerminateBackend finds sessions itself: it ends every session of an
// identity, ranked or not, and none whose name only begins like it.
func TestExternalTerminateBackend(t *testing.T) {
	own := shared.Get(t)
	t.Setenv(pgleadertest.DSNEnv, own.DSN())
	srv, err := pgleadertest.New()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if !srv.External() {
		t.Fatal("a server from PGLEADERTEST_DSN is not External")
	}
	ctx := context.Background()
	alive := map[string]*pgx.Conn{}
	for _, app := range []string{"ext-1", "ext-1 [P2]", "ext-1 [N0 1.8.0]", "ext-10", "ext-1 [x]"} {
		cfg, err := pgx.ParseConfig(own.DSN())
		if err != nil {
			t.Fatal(err)
		}
		cfg.RuntimeParams["application_name"] = app
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		alive[app] = conn
	}
	n, err := srv.TerminateBackend(ctx, "ext-1")
	if err != nil || n != 3 {
		t.Fatalf("TerminateBackend(ext-1): %d, %v; want 3 (the identity, with two ranks)", n, err)
	}
	for app, conn := range alive {
		err := conn.Ping(ctx)
		if want := app == "ext-10" || app == "ext-1 [x]"; (err == nil) != want {
			t.Errorf("%q: ping %v after TerminateBackend(ext-1); want it alive: %v", app, err, want)
		}
	}
}
