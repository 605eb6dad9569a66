package group_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/group"
	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/leader"
)

// quietMember is one member of a group of four keys whose scans are paced
// out (as at 100,000 keys), so that its full rounds between scans prove
// the session alone; its demotions are recorded with their reasons.
type quietMember struct {
	g       *group.Group
	admin   *pgx.Conn
	mu      sync.Mutex
	reasons []error
}

func startQuiet(t *testing.T, srv *testpg.Server, dsn string, cfg group.Config) *quietMember {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(context.Background()) })
	q := &quietMember{admin: admin}
	cfg.Connect, cfg.Group, cfg.Identity, cfg.Keys = leader.DSN(dsn), t.Name(), "quiet", groupKeys(t.Name(), 4)
	cfg.Callbacks = group.Callbacks{
		OnElected: func(ctx context.Context, l leader.Leadership) { <-ctx.Done() },
		OnDemoted: func(l leader.Leadership, reason error) {
			q.mu.Lock()
			q.reasons = append(q.reasons, reason)
			q.mu.Unlock()
		},
	}
	cfg.Logger = testLogger(t, nil)
	if q.g, err = group.New(cfg); err != nil {
		t.Fatal(err)
	}
	group.PaceScans(q.g, time.Hour)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- q.g.Run(rctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	eventually(t, "the member leads its 4 keys", func() (bool, string) { return len(q.g.Owned()) == 4, fmt.Sprint(q.g.Owned()) })
	return q
}

// mainPID is the backend pid of the member's main session: the one whose
// last statement is its group's marker.
func (q *quietMember) mainPID(t *testing.T) uint32 {
	t.Helper()
	var pid int32
	err := q.admin.QueryRow(context.Background(), `SELECT pid FROM pg_stat_activity
		WHERE application_name = 'quiet' AND query LIKE 'SELECT ''pgleader group v1 %'`).Scan(&pid)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(pid)
}

// quietSpan is what pg_stat_activity says of the main session's backend
// across at least three full rounds with no scan and no light round
// between: whether its last statement changed (query_start) and whether
// anything reached it (state_change).
func (q *quietMember) quietSpan(t *testing.T) (statement, reached bool) {
	t.Helper()
	pid := q.mainPID(t)
	read := func() (qs, sc time.Time) {
		err := q.admin.QueryRow(context.Background(), `SELECT query_start, state_change FROM pg_stat_activity WHERE pid = $1`,
			int32(pid)).Scan(&qs, &sc)
		if err != nil {
			t.Fatal(err)
		}
		return qs, sc
	}
	for range 20 {
		before := q.g.Status()
		q0, s0 := read()
		eventually(t, "three more full rounds", func() (bool, string) {
			st := q.g.Status()
			return st.Rounds >= before.Rounds+3, fmt.Sprint(st.Rounds)
		})
		q1, s1 := read()
		if after := q.g.Status(); after.Scans == before.Scans && after.LightRounds == before.LightRounds && after.Rounds >= before.Rounds+3 {
			return !q1.Equal(q0), s1.After(s0)
		}
	}
	t.Fatal("no span of three full rounds without a scan or a light round in 20 tries")
	return false, false
}

// A member on a direct session proves it between scans with no statement
// (a Sync: no transaction, so PostgreSQL does not walk every lock the
// session holds at its end, which at 100,000 keys was most of what a
// standing group cost the server): across its full rounds the backend's
// last statement stays the same while the rounds reach it. Behind a proxy
// (no longer Direct: a pooler could hand the backend to another client,
// which only a statement's pid and token catch) every full round runs
// the check statement.
func TestGroupQuietRounds(t *testing.T) {
	srv := sharedServer(t)
	cfg := group.Config{RenewInterval: 100 * time.Millisecond, RenewDeadline: 2 * time.Second, LeaseDuration: 6 * time.Second}
	t.Run("direct", func(t *testing.T) {
		q := startQuiet(t, srv, srv.DSN(), cfg)
		statement, reached := q.quietSpan(t)
		if statement || !reached {
			t.Fatalf("direct session: a statement ran %v, the rounds reached the backend %v; want no statement, reached", statement, reached)
		}
		if len(q.g.Owned()) != 4 {
			t.Fatalf("owned %v after quiet rounds", q.g.Owned())
		}
	})
	t.Run("behind a proxy", func(t *testing.T) {
		q := startQuiet(t, srv, newProxy(t, srv).DSN(), cfg)
		if statement, _ := q.quietSpan(t); !statement {
			t.Fatal("behind a proxy, three full rounds ran no statement: a session that is not Direct was proven without its pid and token")
		}
	})
}
