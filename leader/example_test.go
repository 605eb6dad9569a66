package leader_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/leader"
)

// A named key is stable, and its pg_locks columns are known in advance.
func ExampleKeyFromName() {
	k := leader.KeyFromName("billing-consumer")
	v, _ := k.Int64()
	classid, objid, objsubid := k.LockTag()
	fmt.Println(v)
	fmt.Println(classid, objid, objsubid)
	// Output:
	// 6869070981396482805
	// 1599330217 3876899573 1
}

// Pair keys keep namespaces apart: confirming and refunding order 7 are
// different locks.
func ExamplePairKey() {
	const confirm, refund = 1, 2
	fmt.Println(leader.PairKey(confirm, 7), leader.PairKey(refund, 7), leader.PairKey(confirm, 7) == leader.PairKey(refund, 7))
	// Output: 1:7 2:7 false
}

// A leader fences each transaction with its Leadership; once a newer leader
// is elected, its writes are refused.
func ExampleLeadership_Fence() {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, exampleDSN())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close(ctx)
	conn.Exec(ctx, leader.TermsTableSQL("example_terms"))
	conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS ledger (term bigint, note text)")
	key := leader.KeyFromName("ledger-writer")
	classid, objid, objsubid := key.LockTag()
	// What an elector with Fencing does at each election:
	install := func(holder string) leader.Leadership {
		var term int64
		conn.QueryRow(ctx, `INSERT INTO example_terms VALUES ($1, $2, $3, $4, 1, $5, now())
			ON CONFLICT (classid, objid, objsubid) DO UPDATE SET term = example_terms.term + 1 RETURNING term`,
			classid, objid, objsubid, key.String(), holder).Scan(&term)
		return leader.Leadership{Key: key, Identity: holder, Term: term, TermsTable: "example_terms"}
	}
	write := func(l leader.Leadership) error {
		return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if err := l.Fence(ctx, tx); err != nil {
				return err // roll back: a newer leader exists
			}
			_, err := tx.Exec(ctx, "INSERT INTO ledger VALUES ($1, 'written')", l.Term)
			return err
		})
	}
	old := install("worker-a")
	fmt.Println("old leader:", write(old))
	install("worker-b")
	err = write(old)
	fmt.Println("old leader after a new election, fenced:", errors.Is(err, leader.ErrFenced))
	// Output:
	// old leader: <nil>
	// old leader after a new election, fenced: true
}

func exampleDSN() string { return shared.DSN() }

// Compare ranks candidates under a Strategy: under NewestVersion the
// version decides, and the priority breaks a tie.
func ExampleCompare() {
	v1 := leader.Preference{Priority: 9, Version: "1.9.0"}
	v2 := leader.Preference{Priority: 0, Version: "2.0.0"}
	fmt.Println(leader.Compare(leader.NewestVersion, v2, v1))
	fmt.Println(leader.Compare(leader.OldestVersion, v2, v1))
	fmt.Println(leader.Compare(leader.ByPriority, v2, v1))
	// Output:
	// 1
	// -1
	// -1
}
