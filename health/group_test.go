package health_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/pgleader/pgleader/group"
	"github.com/pgleader/pgleader/health"
	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/leader"
)

func startGroupMember(t *testing.T, dsn, name, id string, keys []leader.Key) *group.Group {
	t.Helper()
	g, err := group.New(group.Config{
		Connect: leader.DSN(dsn), Group: name, Keys: keys, Identity: id, Logger: testLogger(t),
		RenewInterval: 100 * time.Millisecond, RenewDeadline: 500 * time.Millisecond, LeaseDuration: 1500 * time.Millisecond,
		Callbacks: group.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) { <-ctx.Done() }},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); g.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return g
}

// The group's probes and status: ready with LeaderOnly only while the
// member leads a key, /status shows the group view, POST /resign?key=
// hands one key over, and a member cut off from the database (it leads
// nothing once its trust window passed) stays alive.
func TestGroupChecker(t *testing.T) {
	srv := server(t)
	var keys []leader.Key
	for i := range 4 {
		keys = append(keys, leader.KeyFromName(fmt.Sprintf("%s/%d", t.Name(), i)))
	}
	p, err := testpg.NewProxy(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	a := startGroupMember(t, p.DSN(), t.Name(), "ga", keys)
	startGroupMember(t, srv.DSN(), t.Name(), "gb", keys)
	c := health.NewGroupChecker(a, health.Options{LeaderOnly: true, AllowResign: true})
	hs := httptest.NewServer(c.Handler())
	defer hs.Close()
	waitFor(t, "ga leads 2 of 4 keys, seeing 2 members", func() bool {
		s := c.Snapshot()
		return s.Owned == 2 && len(s.Members) == 2
	})
	if err := c.Ready(); err != nil {
		t.Fatal(err)
	}
	var st health.GroupStatusJSON
	get(t, hs.URL+"/status", http.StatusOK, &st)
	if st.Group != t.Name() || st.Identity != "ga" || st.Keys != 4 || st.Owned != 2 || !st.Connected || !st.Live || !st.Ready || st.Elected < 2 ||
		len(st.Eligible) != 2 || st.Strategy != "ByPriority" || st.Ranks != nil {
		t.Fatalf("status %+v", st)
	}
	owned := a.Owned()
	post := func(q string) int {
		resp, err := http.Post(hs.URL+"/resign"+q, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(""); code != http.StatusBadRequest {
		t.Fatalf("resign without a key: %d", code)
	}
	if code := post("?key=" + url.QueryEscape(owned[0].Name())); code != http.StatusOK {
		t.Fatalf("resign: %d", code)
	}
	if code := post("?key=" + url.QueryEscape(owned[0].Name())); code != http.StatusConflict {
		t.Fatalf("resign of a key it no longer leads: %d", code)
	}
	resp, err := http.Get(hs.URL + "/resign")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("GET /resign: %d", resp.StatusCode)
	}
	p.Blackhole()
	waitFor(t, "ga leads nothing", func() bool { return len(a.Owned()) == 0 })
	if err := c.Ready(); err == nil {
		t.Fatal("ready with LeaderOnly while leading nothing")
	}
	if err := c.Live(); err != nil {
		t.Fatalf("a member cut off from the database is alive: %v", err)
	}
	p.Heal()
}

func get(t *testing.T, u string, code int, v any) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != code {
		t.Fatalf("GET %s: %d", u, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLong)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
