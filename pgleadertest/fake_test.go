package pgleadertest_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/health"
	"github.com/pgleader/pgleader/leader"
	"github.com/pgleader/pgleader/pgleadertest"
)

// A unit test of code around an elector, with no database: the probes
// follow the fake's leadership at once.
func TestFakeDrivesTheProbes(t *testing.T) {
	f := pgleadertest.NewFake("web-1", leader.KeyFromName("web"))
	c := health.NewChecker(f, health.Options{LeaderOnly: true, AllowResign: true})
	srv := httptest.NewServer(c.Handler())
	defer srv.Close()
	get := func(path string) int {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if get("/readyz") != http.StatusServiceUnavailable || get("/livez") != http.StatusOK {
		t.Fatal("a follower: want not ready (LeaderOnly) and live")
	}
	f.Elect()
	select {
	case <-f.Elected():
	default:
		t.Fatal("Elected not closed after Elect")
	}
	if get("/readyz") != http.StatusOK || !f.IsLeader() || f.Leader() != "web-1" {
		t.Fatal("elected: want ready, leading, and itself as the leader")
	}
	resp, err := http.Post(srv.URL+"/resign", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || f.IsLeader() || f.Resigns() != 1 {
		t.Fatalf("POST /resign: %d, leading %v, %d resigns", resp.StatusCode, f.IsLeader(), f.Resigns())
	}
	if err := f.Resign(context.Background()); !errors.Is(err, leader.ErrNotLeader) {
		t.Fatalf("Resign of a follower: %v, want ErrNotLeader", err)
	}
	f.SetLeader("web-2")
	if f.Leader() != "web-2" || f.IsLeader() {
		t.Fatal("SetLeader: want web-2 leading, not the fake")
	}
	// A wedged leader fails liveness: a renew long past its trust window.
	f.Elect()
	f.SetStatus(func(st *elector.Status) { st.LastRenew = time.Now().Add(-time.Hour) })
	if get("/livez") != http.StatusServiceUnavailable {
		t.Fatal("a leader with no renew for an hour: want not live")
	}
	f.Demote(leader.ErrLockLost)
	if st := f.Status(); st.Leading || st.LastError == "" {
		t.Fatalf("after Demote: %+v", st)
	}
}

// PGLEADERTEST_DSN points the helpers at an existing server: the tests use
// it, the fault helpers work where the role allows, and Restart says it
// cannot (for the test to skip).
func TestExternalServer(t *testing.T) {
	real := pgleadertest.Start(t) // stands in for a CI service container
	t.Setenv(pgleadertest.DSNEnv, real.DSN())
	srv, err := pgleadertest.New()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if !srv.External() || srv.DSN() != real.DSN() || srv.Addr() != real.Addr() {
		t.Fatalf("external server: %v %q %q", srv.External(), srv.Addr(), real.Addr())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := srv.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	key := leader.KeyFromName(t.Name())
	args, vals := key.SQLArgs(1)
	holder, err := real.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(ctx)
	if _, err := holder.Exec(ctx, "SET application_name = 'ext-holder'; SELECT 1"); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_lock("+args+")", vals...); err != nil {
		t.Fatal(err)
	}
	if id, err := srv.TerminateLeader(ctx, key); err != nil || id != "ext-holder" {
		t.Fatalf("TerminateLeader on the external server: %q %v", id, err)
	}
	if err := srv.Restart(ctx, pgleadertest.Fast); !errors.Is(err, pgleadertest.ErrExternal) {
		t.Fatalf("Restart on an external server: %v, want ErrExternal", err)
	}
	// A bad DSN fails New with the server's message and no password.
	t.Setenv(pgleadertest.DSNEnv, "postgres://u:hunter2@127.0.0.1:1/db?connect_timeout=1")
	if _, err := pgleadertest.New(); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("New with an unreachable PGLEADERTEST_DSN: %v", err)
	}
}

// SetLeaderValue gives the leader a value; a leader set without one, or
// the fake's own election, has none.
func TestFakeLeaderValue(t *testing.T) {
	f := pgleadertest.NewFake("web-1", leader.KeyFromName("web"))
	if p := f.LeaderValue(); p.Identity != "" || p.Value != nil {
		t.Fatalf("no leader: %+v", p)
	}
	f.SetLeaderValue("web-2", []byte("http://10.0.0.2"))
	if p := f.LeaderValue(); p.Identity != "web-2" || string(p.Value) != "http://10.0.0.2" || f.Leader() != "web-2" {
		t.Fatalf("after SetLeaderValue: %+v, leader %q", p, f.Leader())
	}
	f.SetLeader("web-3")
	if p := f.LeaderValue(); p.Identity != "web-3" || p.Value != nil {
		t.Fatalf("after SetLeader: %+v", p)
	}
}
