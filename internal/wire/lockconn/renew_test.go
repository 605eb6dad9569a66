package lockconn_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/leader"
)

// RenewSession, a leader's paced renew without pg_locks: true while this
// backend holds the lock, waiters or not; false once another session holds
// it; it never stacks (one unlock frees the lock after any number of
// them); and, unlike Renew, it cannot tell a lock the session lost that
// nobody took (its documented blind spot, which Renew covers).
func TestRenewSession(t *testing.T) {
	ctx := context.Background()
	for _, key := range []leader.Key{leader.KeyFromName(t.Name()), leader.PairKey(-7, 42), leader.Int64Key(-1 << 40)} {
		ls := openLease(t, "session-renew", time.Second)
		target := lockconn.NewTarget(key, "", "", "")
		if r, err := ls.Campaign(ctx, target, true); err != nil || !r.Held {
			t.Fatalf("%v: Campaign: %+v %v", key, r, err)
		}
		other := plainConn(t)
		// A waiter queued on the held lock.
		call, vals := "SELECT pg_advisory_lock($1::int8)", []any{}
		try := "SELECT pg_try_advisory_lock($1::int8)"
		if k, ok := key.Int64(); ok {
			vals = append(vals, k)
		} else {
			ns, id, _ := key.Pair()
			call, try, vals = "SELECT pg_advisory_lock($1::int4, $2::int4)", "SELECT pg_try_advisory_lock($1::int4, $2::int4)", []any{ns, id}
		}
		waited := make(chan error, 1)
		go func() { _, err := other.Exec(ctx, call, vals...); waited <- err }()
		admin, err := server(t).Connect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer admin.Close(ctx)
		waitingOn(t, admin, key, other.PgConn().PID())
		for i := 0; i < 5; i++ {
			if err := ls.RenewSession(ctx, target); err != nil {
				t.Fatalf("%v: RenewSession while holding, a waiter queued: %v", key, err)
			}
		}
		// One unlock frees it (the renews did not stack): the waiter gets it.
		if err := ls.Unlock(ctx, target); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-waited:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%v: the waiter never got the lock after one unlock: the renews stacked", key)
		}
		if err := ls.RenewSession(ctx, target); !errors.Is(err, lockconn.ErrLockLost) {
			t.Fatalf("%v: RenewSession with another session holding the lock: %v, want ErrLockLost", key, err)
		}
		if _, err := other.Exec(ctx, "SELECT pg_advisory_unlock_all()"); err != nil {
			t.Fatal(err)
		}
		// Free, nobody waiting: the blind spot, which Renew covers.
		if err := ls.RenewSession(ctx, target); err != nil {
			t.Fatalf("%v: RenewSession on a free lock: %v (its blind spot changed: update the docs)", key, err)
		}
		if err := ls.Renew(ctx, target); !errors.Is(err, lockconn.ErrLockLost) {
			t.Fatalf("%v: Renew on a free lock: %v, want ErrLockLost", key, err)
		}
		// And the renew's transaction hold is gone: another session takes it.
		var ok bool
		if err := other.QueryRow(ctx, try, vals...).Scan(&ok); err != nil || !ok {
			t.Fatalf("%v: the lock after RenewSession on a free lock: %v %v", key, ok, err)
		}
	}
}

// RenewSession proves the session as Renew does: after a reset that keeps
// the backend but drops the session's token (a pooler's DISCARD ALL), it
// reports the session gone, even while the backend holds the lock again.
func TestRenewSessionSeesAReset(t *testing.T) {
	ctx := context.Background()
	ls := openLease(t, "session-reset", time.Second)
	target := lockconn.NewTarget(leader.KeyFromName(t.Name()), "", "", "")
	if r, err := ls.Campaign(ctx, target, true); err != nil || !r.Held {
		t.Fatalf("Campaign: %+v %v", r, err)
	}
	if _, err := ls.Conn().Exec(ctx, "DISCARD ALL"); err != nil {
		t.Fatal(err)
	}
	if _, err := ls.Conn().Exec(ctx, target.Call("pg_advisory_lock"), target.Vals...); err != nil {
		t.Fatal(err)
	}
	if err := ls.RenewSession(ctx, target); !errors.Is(err, lockconn.ErrTransactionPooling) {
		t.Fatalf("RenewSession after DISCARD ALL: %v, want ErrTransactionPooling", err)
	}
}
