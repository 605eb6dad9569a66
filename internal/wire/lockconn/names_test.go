package lockconn_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/leader"
)

// namesCases: does a session whose application_name is app stand as the
// candidate identity? A ranked candidate's application_name is its
// identity and its rank (leader.Rank); nothing else that begins with the
// identity names it.
var namesCases = []struct {
	app, identity string
	want          bool
}{
	{"w", "w", true},
	{"w [P0]", "w", true},
	{"w [P-2]", "w", true},
	{"w [N0 1.8.0]", "w", true},
	{"w [O3 v2.0.0-rc.1+b7]", "w", true},
	{"w [N0 1.8.0]", "w [N0 1.8.0]", true},
	{"w2", "w", false},
	{"w [X0]", "w", false},
	{"w [P]", "w", false},
	{"w [Pa]", "w", false},
	{"w [N0 ]", "w", false},
	{"w [N0 x1]", "w", false},
	{"w [N0 1.0] [P1]", "w", false},
	{"w [P0] x", "w", false},
	{"w [P0", "w", false},
	{"ww [P0]", "w", false},
	{"w  [P0]", "w", false},
	{"[P0]", "", false},
	{"w", "w [P0]", false},
}

// Names, and the handover statements that find a named candidate in
// pg_locks (standing, reserve, queued), match names alike: a reservation
// for a ranked candidate binds to its session, and to no other.
func TestRankedNamesMatchInGoAndSQL(t *testing.T) {
	ctx := context.Background()
	asker, _ := session(t, "asker", 0)
	for _, c := range namesCases {
		if got := lockconn.Names(c.app, c.identity); got != c.want {
			t.Errorf("Names(%q, %q) = %v, want %v", c.app, c.identity, got, c.want)
		}
		t.Run(fmt.Sprintf("%q as %q", c.app, c.identity), func(t *testing.T) {
			// A key of its own: the session a case before closed may
			// still be in pg_locks (its backend exits after the close,
			// late on a loaded machine).
			target := lockconn.NewTarget(leader.KeyFromName(t.Name()), "", "", "")
			conn, _ := session(t, c.app, 0)
			if _, err := conn.Exec(ctx, fmt.Sprintf("SELECT pg_advisory_lock_shared(%d, %d)", lockconn.Space, target.Roster())); err != nil {
				t.Fatal(err)
			}
			defer lockconn.Close(conn)
			got, err := lockconn.Standing(ctx, asker, target, c.identity)
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("the standing statement finds %q as %q: %v, want %v", c.app, c.identity, got, c.want)
			}
		})
	}
}

// A reserved handover to a ranked candidate: the reservation finds it
// queued by its identity although its application_name carries its rank,
// the candidate takes the lock, and Unreserve sees it there at once (not
// only when its wait bound ends) and returns its application_name.
func TestReservedHandoverToRankedCandidate(t *testing.T) {
	ctx := context.Background()
	key := leader.KeyFromName(t.Name())
	leaderLs := openLease(t, "the-leader", time.Second)
	target := lockconn.NewTarget(key, "", "", "")
	if r, err := leaderLs.Campaign(ctx, target, true); err != nil || !r.Held {
		t.Fatalf("the leader's campaign: %+v %v", r, err)
	}
	conn, err := leader.DSN(server(t).DSN()).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	heir, err := lockconn.Open(ctx, conn, lockconn.Settings{Identity: "heir", AppName: "heir [P3]", LockTimeout: time.Second, Lease: 30 * time.Second, KeepIdle: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(heir.Close)
	if quiet, _, err := heir.Watch(ctx, target, lockconn.Quiet{Wait: 200 * time.Millisecond, Poll: time.Hour, Heirs: 1, Lease: 30 * time.Second}); err != nil || !quiet {
		t.Fatalf("Watch: %v %v", quiet, err)
	}
	if err := heir.TakeSlot(target, 0); err != nil {
		t.Fatal(err)
	}
	won := make(chan error, 1)
	go func() {
		for {
			r, err := heir.Campaign(ctx, target, false)
			if err != nil || r.Held {
				won <- err
				return
			}
		}
	}()
	if err := leaderLs.Reserve(ctx, target, "heir", 10*time.Second); err != nil {
		t.Fatalf("Reserve for the ranked heir: %v", err)
	}
	if err := leaderLs.Unlock(ctx, target); err != nil {
		t.Fatal(err)
	}
	const within = 20 * time.Second
	began := time.Now()
	holder, err := leaderLs.Unreserve(ctx, target, "heir", within)
	if err != nil || holder != "heir [P3]" {
		t.Fatalf("Unreserve: %q %v, want the heir's application_name", holder, err)
	}
	if took := time.Since(began); took > within/2 {
		t.Fatalf("Unreserve took %s: it did not see the ranked heir holding the lock", took)
	}
	if err := <-won; err != nil {
		t.Fatal(err)
	}
}
