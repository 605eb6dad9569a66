package elector_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/health"
	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/leader"
)

func mustConn(t testing.TB, srv *testpg.Server) *pgx.Conn {
	t.Helper()
	conn, err := srv.Connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// waitWaiter waits until the elector named id queues on key.
func waitWaiter(t testing.TB, srv *testpg.Server, key leader.Key, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	if err := testpg.WaitWaiter(ctx, mustConn(t, srv), key, id); err != nil {
		t.Fatal(err)
	}
}

// eventually polls cond every 5ms until it holds, and fails the test with
// what (and the last detail cond gave) when it does not within waitLong.
// eventuallyExplained is the one poll loop of these tests: every wait is
// bounded.
func eventually(t testing.TB, what string, cond func() (bool, string)) {
	t.Helper()
	var detail string
	eventuallyExplained(t, what, func() bool {
		ok, d := cond()
		detail = d
		return ok
	}, func() string { return detail })
}

// eventuallyExplained is eventually whose failure message, detail(), is
// only worked out when it fails (a server read, say).
func eventuallyExplained(t testing.TB, what string, cond func() bool, detail func() string) {
	t.Helper()
	eventuallyWithin(t, what, waitLong, cond, detail)
}

// eventuallyWithin is eventuallyExplained bounded by within instead of
// waitLong, for waits that grow with the electors' timings.
func eventuallyWithin(t testing.TB, what string, within time.Duration, cond func() bool, detail func() string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s (%s)", what, within, detail())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// lockDump lists, for a failure's message, every session of the server
// named like one of ids (optionally with a rank) and every advisory lock
// on key or held by such a session, with what each session is doing.
func lockDump(srv *testpg.Server, key leader.Key, ids ...string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := srv.Connect(ctx)
	if err != nil {
		return "lock dump: " + err.Error()
	}
	defer conn.Close(context.Background())
	c, o, s := key.LockTag()
	rows, err := conn.Query(ctx, `WITH a AS (SELECT * FROM pg_stat_activity WHERE split_part(application_name, ' [', 1) = ANY($4::text[]))
SELECT coalesce(a.pid, l.pid), coalesce(a.application_name, '?'), coalesce(a.state, '?'), coalesce(a.wait_event, ''),
  coalesce(left(a.query, 60), ''), coalesce(l.classid::text || '/' || l.objid || '/' || l.objsubid || ' ' || l.mode || CASE WHEN l.granted THEN ' granted' ELSE ' waiting' END, '')
FROM a FULL JOIN (SELECT * FROM pg_locks WHERE locktype = 'advisory') l ON l.pid = a.pid
WHERE a.pid IS NOT NULL OR (l.classid = $1 AND l.objid = $2 AND l.objsubid = $3)
ORDER BY 1, 6`, c, o, s, ids)
	if err != nil {
		return "lock dump: " + err.Error()
	}
	defer rows.Close()
	var b strings.Builder
	fmt.Fprintf(&b, "key %d/%d/%d;", c, o, s)
	for rows.Next() {
		var pid int32
		var app, state, wait, query, lock string
		if err := rows.Scan(&pid, &app, &state, &wait, &query, &lock); err != nil {
			return b.String() + " lock dump: " + err.Error()
		}
		fmt.Fprintf(&b, "\n  pid %d %q %s %s %q: %s", pid, app, state, wait, query, lock)
	}
	if err := rows.Err(); err != nil {
		fmt.Fprintf(&b, " lock dump: %v", err)
	}
	return b.String()
}

// sessions counts the sessions named like pattern (SQL LIKE).
func sessions(t testing.TB, srv *testpg.Server, pattern string) int64 {
	t.Helper()
	n, err := srv.QueryInt(context.Background(), "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1", pattern)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

const writesDDL = `CREATE TABLE IF NOT EXISTS fenced_writes (id bigserial PRIMARY KEY, key_name text NOT NULL, term bigint NOT NULL, writer text NOT NULL)`

// fencedWrite records one write under l's term, refused when fenced.
func fencedWrite(ctx context.Context, dsn string, l leader.Leadership) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return writeWith(ctx, conn, l)
}

func writeWith(ctx context.Context, conn *pgx.Conn, l leader.Leadership) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if err := l.Fence(ctx, tx); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO fenced_writes (key_name, term, writer) VALUES ($1, $2, $3)`, l.Key.String(), l.Term, l.Identity)
		return err
	})
}

// staleWrites counts accepted writes of a key whose term is lower than the
// term of a write committed before them: writes of a deposed leader.
func staleWrites(t testing.TB, srv *testpg.Server, key leader.Key) int64 {
	t.Helper()
	n, err := srv.QueryInt(context.Background(), `SELECT count(*) FROM (
		SELECT term, max(term) OVER (ORDER BY id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before
		FROM fenced_writes WHERE key_name = $1) s WHERE term < before`, key.String())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func waitAllSee(t *testing.T, els map[string]*running, id string) {
	t.Helper()
	for _, rn := range els {
		eventually(t, rn.e.Identity()+" sees "+id+" lead", func() (bool, string) {
			return rn.e.Leader() == id, "Leader() = " + rn.e.Leader()
		})
	}
}

// waitAllReported waits until OnNewLeader has reported id as the latest
// leader to every elector: it runs on its own goroutine, a moment after
// Leader() changes.
func waitAllReported(t *testing.T, r *recorder, els map[string]*running, id string) {
	t.Helper()
	for name := range els {
		eventually(t, "OnNewLeader reports "+id+" to "+name, func() (bool, string) {
			r.mu.Lock()
			defer r.mu.Unlock()
			last := ""
			for _, e := range r.events {
				if e.kind == "newleader" && e.id == name {
					last = e.leader
				}
			}
			return last == id, "last reported " + last
		})
	}
}

// waitWrites waits until a write under term is in the table.
func waitWrites(t *testing.T, srv *testpg.Server, key leader.Key, term int64) {
	t.Helper()
	eventually(t, fmt.Sprint("a write under term ", term), func() (bool, string) {
		n, err := srv.QueryInt(context.Background(), `SELECT count(*) FROM fenced_writes WHERE key_name = $1 AND term = $2`, key.String(), term)
		return err == nil && n > 0, fmt.Sprint(err)
	})
}

// newProxy starts a fault proxy in front of srv, closed at cleanup.
func newProxy(t testing.TB, srv *testpg.Server) *testpg.Proxy {
	t.Helper()
	p, err := testpg.NewProxy(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
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

// readyProbe is leader-only readiness for e, as health serves it.
func readyProbe(e *elector.Elector) func() error {
	return health.NewChecker(e, health.Options{LeaderOnly: true}).Ready
}

// askUntilHeard sends a resign request (payload) on channel from conn,
// which listens on its reply channel, every 100 ms until an answer comes,
// as RequestResign does: a leader listens for requests only from its
// first renew on. It returns the answer, after the answers to the copies
// (read until none comes for 5 intervals).
func askUntilHeard(t testing.TB, conn *pgx.Conn, channel, payload string) string {
	t.Helper()
	if a, ok := tryAsk(t, conn, channel, payload, waitLong); ok {
		return a
	}
	t.Fatalf("no answer to %q on %s within %s", payload, channel, waitLong)
	return ""
}

// tryAsk is askUntilHeard for at most within; false when no answer came.
func tryAsk(t testing.TB, conn *pgx.Conn, channel, payload string, within time.Duration) (string, bool) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if _, err := conn.Exec(ctx, "SELECT pg_notify($1, $2)", channel, payload); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		if err != nil {
			continue
		}
		for {
			wctx, cancel := context.WithTimeout(ctx, 5*tInterval)
			_, err := conn.WaitForNotification(wctx)
			cancel()
			if err != nil {
				return n.Payload, true
			}
		}
	}
	return "", false
}

// electorStates describes each elector's state, for a failure's message.
func electorStates(els map[string]*running) string {
	var b strings.Builder
	for _, rn := range els {
		st := rn.e.Status()
		fmt.Fprintf(&b, "%s: leading %v, tenure %v, leader %q, connected %v, last round %s ago, last error %q; ",
			st.Identity, st.Leading, st.Tenure, st.Leader, st.Connected, time.Since(st.LastRound).Round(time.Millisecond), st.LastError)
	}
	return b.String()
}
