package leader_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/leader"
)

// Fence holds a share lock on the term row: a new term cannot be installed
// while a fenced transaction of the old leader is open, and once it is,
// the old leader's Fence fails with ErrFenced.
func TestFenceOrdersAgainstNewTerm(t *testing.T) {
	ctx := context.Background()
	const table = "fence_test_terms"
	admin := conn(t)
	if _, err := admin.Exec(ctx, leader.TermsTableSQL(table)); err != nil {
		t.Fatal(err)
	}
	key := leader.KeyFromName(t.Name())
	classid, objid, objsubid := key.LockTag()
	if _, err := admin.Exec(ctx, `INSERT INTO fence_test_terms VALUES ($1, $2, $3, $4, 7, 'old', now()) ON CONFLICT (classid, objid, objsubid) DO UPDATE SET term = 7`, classid, objid, objsubid, key.String()); err != nil {
		t.Fatal(err)
	}
	old := leader.Leadership{Key: key, Term: 7, TermsTable: table}

	oldConn := conn(t)
	tx, err := oldConn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Fence(ctx, tx); err != nil {
		t.Fatalf("Fence with the current term: %v", err)
	}

	// The new leader's term update waits for the old transaction.
	newConn := conn(t)
	var newPid uint32
	if err := newConn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&newPid); err != nil {
		t.Fatal(err)
	}
	bumped := make(chan error, 1)
	go func() {
		_, err := newConn.Exec(ctx, `UPDATE fence_test_terms SET term = term + 1 WHERE classid = $1 AND objid = $2 AND objsubid = $3`, classid, objid, objsubid)
		bumped <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for waiting := false; !waiting; {
		if time.Now().After(deadline) {
			t.Fatal("the term update never waited on a lock")
		}
		if err := admin.QueryRow(ctx, "SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1", newPid).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-bumped:
			t.Fatalf("term update did not wait for the fenced transaction (err %v)", err)
		default:
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("old leader's commit before the new term: %v", err)
	}
	select {
	case err := <-bumped:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the term update never finished")
	}

	// Now the old term is fenced, with a typed error.
	err = pgx.BeginFunc(ctx, oldConn, func(tx pgx.Tx) error { return old.Fence(ctx, tx) })
	var fe *leader.FencedError
	if !errors.Is(err, leader.ErrFenced) || !errors.As(err, &fe) || fe.Current != 8 || fe.Term != 7 {
		t.Fatalf("want FencedError 7 < 8, got %v", err)
	}
	cur := leader.Leadership{Key: key, Term: 8, TermsTable: table}
	if err := pgx.BeginFunc(ctx, oldConn, func(tx pgx.Tx) error { return cur.Fence(ctx, tx) }); err != nil {
		t.Fatalf("current term fenced: %v", err)
	}
	unknown := leader.Leadership{Key: leader.KeyFromName("never-elected"), Term: 1, TermsTable: table}
	if err := pgx.BeginFunc(ctx, oldConn, func(tx pgx.Tx) error { return unknown.Fence(ctx, tx) }); !errors.Is(err, leader.ErrFenced) {
		t.Fatalf("key without a term: want ErrFenced, got %v", err)
	}
	if err := pgx.BeginFunc(ctx, oldConn, func(tx pgx.Tx) error { return (leader.Leadership{Key: key}).Fence(ctx, tx) }); !errors.Is(err, leader.ErrNoFencing) {
		t.Fatalf("no fencing: want ErrNoFencing, got %v", err)
	}
	missing := leader.Leadership{Key: key, Term: 1, TermsTable: "nowhere.terms"}
	err = pgx.BeginFunc(ctx, oldConn, func(tx pgx.Tx) error { return missing.Fence(ctx, tx) })
	if !errors.Is(err, leader.ErrNoTermsTable) || !strings.Contains(err.Error(), "CREATE TABLE") {
		t.Fatalf("missing table: %v", err)
	}
}
