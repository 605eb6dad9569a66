package elector_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/leader"
)

// sabotaged is a real session that, once armed, unlocks its own lock just
// before its next renew: the bug (an unlock the elector does not know of)
// that a renew's proof exists to catch.
type sabotaged struct {
	elector.Lease
	key   leader.Key
	armed *atomic.Bool
}

func (s sabotaged) unlock(ctx context.Context) {
	if !s.armed.CompareAndSwap(true, false) {
		return
	}
	k, _ := s.key.Int64()
	if _, err := s.Lease.(*lockconn.Lease).Conn().Exec(ctx, "SELECT pg_advisory_unlock($1::int8)", k); err != nil {
		panic(err)
	}
}

func (s sabotaged) Renew(ctx context.Context, t *lockconn.Target) error {
	s.unlock(ctx)
	return s.Lease.Renew(ctx, t)
}

func (s sabotaged) RenewSession(ctx context.Context, t *lockconn.Target) error {
	s.unlock(ctx)
	return s.Lease.RenewSession(ctx, t)
}

func startSabotaged(t *testing.T, srv *testpg.Server, r *recorder, key leader.Key, id string) *atomic.Bool {
	armed := new(atomic.Bool)
	start(t, r, opts{dsn: srv.DSN(), key: key, id: id, wrap: func(ls elector.Lease) elector.Lease {
		return sabotaged{Lease: ls, key: key, armed: armed}
	}})
	r.next("elected", id)
	return armed
}

// Between two pg_locks proofs, a renew that proves only the session still
// ends the tenure at once when another session holds the lock: here a
// waiter the leader's own (buggy) unlock let in.
func TestSessionRenewSeesAnotherHolder(t *testing.T) {
	defer elector.SetFullProofEvery(elector.SetFullProofEvery(1 << 30))
	srv := testpg.Start(t)
	r := newRecorder(t)
	key := testKey(t)
	armed := startSabotaged(t, srv, r, key, "sab-holder")
	ctx := context.Background()
	other, err := pgx.Connect(ctx, srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	k, _ := key.Int64()
	got := make(chan error, 1)
	go func() { _, err := other.Exec(ctx, "SELECT pg_advisory_lock($1::int8)", k); got <- err }()
	admin, err := srv.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	eventually(t, "the other session queues", func() (bool, string) {
		h, err := leader.Holder(ctx, admin, key)
		if err != nil {
			t.Fatal(err)
		}
		return len(h.Waiters) == 1, ""
	})
	armed.Store(true)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	d := r.next("demoted", "sab-holder")
	if !errors.Is(d.reason, leader.ErrLockLost) {
		t.Fatalf("demoted with %v, want ErrLockLost", d.reason)
	}
}

// A lock the leader's session lost that nobody took (the one case a
// session renew cannot tell from a held lock) is caught by the pg_locks
// proof that comes every so many renews.
func TestPgLocksProofCatchesASilentlyFreedLock(t *testing.T) {
	defer elector.SetFullProofEvery(elector.SetFullProofEvery(3))
	srv := testpg.Start(t)
	r := newRecorder(t)
	key := testKey(t)
	armed := startSabotaged(t, srv, r, key, "sab-free")
	armed.Store(true)
	d := r.next("demoted", "sab-free")
	if !errors.Is(d.reason, leader.ErrLockLost) {
		t.Fatalf("demoted with %v, want ErrLockLost", d.reason)
	}
}
