package health_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/health"
	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/leader"
)

var shared testpg.Shared

func server(t testing.TB) *testpg.Server { return shared.Get(t) }

func TestMain(m *testing.M) { os.Exit(testpg.Main(m, nil, &shared)) }

const waitLong = 30 * time.Second

type node struct {
	e       *elector.Elector
	c       *health.Checker
	http    *httptest.Server
	elected chan time.Time
	demoted chan error
}

func startNode(t *testing.T, conn elector.Connector, key leader.Key, id string, obs leader.Observer, hopts health.Options) *node {
	t.Helper()
	n := &node{elected: make(chan time.Time, 16), demoted: make(chan error, 16)}
	var err error
	n.e, err = elector.New(elector.Config{
		Connect: conn, Key: key, Identity: id, Observer: obs, Logger: testLogger(t),
		RenewInterval: 100 * time.Millisecond, RenewDeadline: 500 * time.Millisecond, LeaseDuration: 1500 * time.Millisecond,
		Callbacks: elector.Callbacks{
			OnElected: func(ctx context.Context, l leader.Leadership) {
				n.elected <- time.Now()
				<-ctx.Done()
			},
			OnDemoted: func(l leader.Leadership, reason error) { n.demoted <- reason },
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	n.c = health.NewChecker(n.e, hopts)
	n.http = httptest.NewServer(n.c.Handler())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); n.e.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; n.http.Close() })
	return n
}

func (n *node) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(n.http.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func wait[T any](t *testing.T, ch chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitLong):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// Leader-only readiness follows leadership on resign and on a backend kill.
func TestLeaderOnlyReadinessFlips(t *testing.T) {
	s := server(t)
	key := leader.KeyFromName(t.Name())
	a := startNode(t, elector.DSN(s.DSN()), key, "ready-a", nil, health.Options{LeaderOnly: true})
	wait(t, a.elected, "a elected")
	b := startNode(t, elector.DSN(s.DSN()), key, "ready-b", nil, health.Options{LeaderOnly: true})
	waitForWaiter(t, s, key, "ready-b")
	if code, _ := a.get(t, "/readyz"); code != 200 {
		t.Fatalf("leader a: readyz %d", code)
	}
	if code, body := b.get(t, "/readyz"); code != 503 || !strings.Contains(body, "not the leader") {
		t.Fatalf("follower b: readyz %d %q", code, body)
	}
	// Resign: b becomes ready at its election, a is unready from its demotion.
	if err := a.e.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	wait(t, b.elected, "b elected")
	if code, _ := a.get(t, "/readyz"); code != 503 {
		t.Fatalf("resigned a: readyz %d", code)
	}
	if code, _ := b.get(t, "/readyz"); code != 200 {
		t.Fatalf("new leader b: readyz %d", code)
	}
	// Backend kill: the same the other way round, once a queues for the lock.
	waitForWaiter(t, s, key, "ready-a")
	if _, err := s.TerminateBackend(context.Background(), "ready-b"); err != nil {
		t.Fatal(err)
	}
	wait(t, a.elected, "a elected again")
	if code, _ := b.get(t, "/readyz"); code != 503 {
		t.Fatalf("killed b: readyz %d", code)
	}
	if code, _ := a.get(t, "/readyz"); code != 200 {
		t.Fatalf("a: readyz %d", code)
	}
}

// stubbornConn ignores deadlines once told to: the connection of a broken
// network stack or dialer, on which the elector cannot time out a read.
type stubbornConn struct {
	net.Conn
	ignore *atomic.Bool
}

func (c stubbornConn) SetDeadline(t time.Time) error {
	if c.ignore.Load() {
		return nil
	}
	return c.Conn.SetDeadline(t)
}

func (c stubbornConn) SetReadDeadline(t time.Time) error {
	if c.ignore.Load() {
		return nil
	}
	return c.Conn.SetReadDeadline(t)
}

// Liveness fails for a wedged leader (its connection black-holed and its
// step-down path blocked), and recovers once the connection dies.
func TestLivenessFailsForWedgedLeader(t *testing.T) {
	s := server(t)
	proxy, err := testpg.NewProxy(s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	var ignore atomic.Bool
	cfg, err := pgx.ParseConfig(proxy.DSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return stubbornConn{Conn: c, ignore: &ignore}, nil
	}
	conn := elector.ConnectFunc(func(ctx context.Context) (*pgx.Conn, error) { return pgx.ConnectConfig(ctx, cfg) })
	key := leader.KeyFromName(t.Name())
	n := startNode(t, conn, key, "wedged", nil, health.Options{Tolerance: 200 * time.Millisecond})
	wait(t, n.elected, "elected")
	if err := n.c.Live(); err != nil {
		t.Fatalf("healthy leader not live: %v", err)
	}
	ignore.Store(true)
	proxy.Blackhole()
	deadline := time.Now().Add(waitLong)
	for {
		err := n.c.Live()
		if err != nil {
			if !errors.Is(err, health.ErrNotLive) || !strings.Contains(err.Error(), "believes it leads") {
				t.Fatalf("unexpected liveness error: %v", err)
			}
			if code, body := n.get(t, "/livez"); code != 503 || !strings.Contains(body, "no renew") {
				t.Fatalf("livez %d %q", code, body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a wedged leader stayed live")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n.e.IsLeader() {
		t.Fatal("IsLeader true past the trust window")
	}
	ignore.Store(false)
	proxy.Heal() // the read fails, the elector steps down and recovers
	if reason := wait(t, n.demoted, "demoted"); !errors.Is(reason, leader.ErrConnectionLost) && !errors.Is(reason, leader.ErrRenewDeadline) {
		t.Fatalf("reason %v", reason)
	}
	wait(t, n.elected, "elected again")
	if err := n.c.Live(); err != nil {
		t.Fatalf("recovered leader not live: %v", err)
	}
}

// A database outage does not fail liveness, for the leader or a follower.
func TestLivenessDuringOutage(t *testing.T) {
	s := testpg.Start(t)
	key := leader.KeyFromName(t.Name())
	opts := health.Options{StallTimeout: 2 * time.Second}
	a := startNode(t, elector.DSN(s.DSN()), key, "out-a", nil, opts)
	wait(t, a.elected, "a elected")
	b := startNode(t, elector.DSN(s.DSN()), key, "out-b", nil, opts)
	if err := s.Stop(testpg.Fast); err != nil {
		t.Fatal(err)
	}
	wait(t, a.demoted, "a demoted")
	// Watch both for twice the stall timeout while the server is down.
	until := time.Now().Add(2 * opts.StallTimeout)
	for time.Now().Before(until) {
		for _, n := range []*node{a, b} {
			if err := n.c.Live(); err != nil {
				t.Fatalf("%s not live during the outage: %v", n.e.Identity(), err)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st := b.e.Status(); st.Connected || st.LastError == "" {
		t.Fatalf("status during the outage: %+v", st)
	}
	if err := s.StartAgain(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.elected:
	case <-b.elected:
	case <-time.After(waitLong):
		t.Fatal("no leader after the outage")
	}
}

// The JSON status has exactly the documented fields.
func TestStatusJSONShape(t *testing.T) {
	s := server(t)
	key := leader.KeyFromName(t.Name())
	n := startNode(t, elector.DSN(s.DSN()), key, "json-a", nil, health.Options{LeaderOnly: true})
	wait(t, n.elected, "elected")
	code, body := n.get(t, "/status")
	if code != 200 {
		t.Fatalf("status %d", code)
	}
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	var st health.StatusJSON
	if err := dec.Decode(&st); err != nil {
		t.Fatalf("status does not match StatusJSON: %v\n%s", err, body)
	}
	var raw map[string]any
	json.Unmarshal([]byte(body), &raw)
	for _, f := range []string{"identity", "key", "leading", "leader", "term", "since", "last_renew", "last_error", "connected", "live", "ready",
		"priority", "strategy"} {
		if _, ok := raw[f]; !ok {
			t.Errorf("field %q missing from %s", f, body)
		}
	}
	if st.Identity != "json-a" || !st.Leading || st.Leader != "json-a" || st.Since == nil || st.LastRenew == nil || !st.Live || !st.Ready || !st.Connected ||
		st.Strategy != "ByPriority" || st.Why != "first come" {
		t.Fatalf("status: %+v", st)
	}
}

func testLogger(t *testing.T) *zap.Logger {
	if os.Getenv("PGLEADER_TEST_LOGS") == "" {
		return nil
	}
	return zaptest.NewLogger(t)
}

// waitForWaiter waits until id queues for key's lock.
func waitForWaiter(t *testing.T, s *testpg.Server, key leader.Key, id string) {
	t.Helper()
	conn, err := s.Connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := testpg.WaitWaiter(context.Background(), conn, key, id); err != nil {
		t.Fatal(err)
	}
}

// POST /resign steps the leader down, only when AllowResign is set.
func TestResignEndpoint(t *testing.T) {
	conn := elector.DSN(shared.DSN())
	key := leader.KeyFromName(t.Name())
	a := startNode(t, conn, key, "resign-a", nil, health.Options{AllowResign: true})
	wait(t, a.elected, "a elected")
	b := startNode(t, conn, key, "resign-b", nil, health.Options{})
	if code, _ := b.get(t, "/resign"); code != http.StatusNotFound {
		t.Fatalf("/resign without AllowResign: %d, want 404", code)
	}
	if code, _ := a.get(t, "/resign"); code != http.StatusMethodNotAllowed {
		t.Fatalf("GET /resign: %d, want 405", code)
	}
	resp, err := http.Post(a.http.URL+"/resign", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /resign: %d", resp.StatusCode)
	}
	if reason := wait(t, a.demoted, "a demoted"); !errors.Is(reason, leader.ErrResigned) {
		t.Fatalf("demoted for %v", reason)
	}
	wait(t, b.elected, "b elected")
	resp, err = http.Post(a.http.URL+"/resign", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict {
		t.Fatalf("POST /resign on a follower: %d, want 409", resp.StatusCode)
	}
}
