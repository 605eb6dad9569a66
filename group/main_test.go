package group_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/pgleader/pgleader/internal/testpg"
)

var shared testpg.Shared

// sharedServer returns the package's throwaway server, for tests that do
// not restart it. Each test uses its own group and keys.
func sharedServer(t testing.TB) *testpg.Server { return shared.Get(t) }

func TestMain(m *testing.M) { os.Exit(testpg.Main(m, nil, &shared)) }

// waitLong bounds every wait of these tests: far beyond any interval,
// lease or poll involved, for a loaded 2-core machine.
const waitLong = 30 * time.Second

// testLogger returns l, or with PGLEADER_TEST_LOGS set a logger into the
// test's output.
func testLogger(t testing.TB, l *zap.Logger) *zap.Logger {
	if l == nil && os.Getenv("PGLEADER_TEST_LOGS") != "" {
		return zaptest.NewLogger(t)
	}
	return l
}

func mustConn(t testing.TB, srv *testpg.Server) *pgx.Conn {
	t.Helper()
	conn, err := srv.Connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// eventually polls cond every 5ms until it holds, and fails the test with
// what (and the last detail cond gave) when it does not within waitLong.
// With eventuallyWithin, it is the one poll loop of these tests: every wait
// is bounded.
func eventually(t testing.TB, what string, cond func() (bool, string)) {
	t.Helper()
	eventuallyWithin(t, what, waitLong, cond)
}

// eventuallyWithin is eventually with a bound of its own, for a test whose
// assertion is the bound (a hand-over that must not wait out a hold).
func eventuallyWithin(t testing.TB, what string, bound time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		ok, detail := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s (%s)", what, bound, detail)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// recv receives from ch, failing the test with what when nothing comes
// within waitLong: no test waits without a bound.
func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitLong):
		t.Fatalf("no %s within %s", what, waitLong)
		var zero T
		return zero
	}
}

func newProxy(t testing.TB, srv *testpg.Server) *testpg.Proxy {
	t.Helper()
	p, err := testpg.NewProxy(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// serverLog returns the throwaway server's log lines so far.
func serverLog(srv *testpg.Server) []string {
	s := strings.TrimSpace(srv.LogTail(1 << 20))
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}
