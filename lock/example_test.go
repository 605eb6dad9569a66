package lock_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/leader"
	"github.com/pgleader/pgleader/lock"
)

func exampleDSN() string { return shared.DSN() }

// Run a job on exactly one replica: every replica calls TryRun, one runs
// it, the others learn who holds it.
func ExampleTryRun() {
	ctx := context.Background()
	key := leader.KeyFromName("nightly-report")
	err := lock.TryRun(ctx, leader.DSN(exampleDSN()), key, lock.Options{Identity: "replica-1"},
		func(ctx context.Context) error {
			fmt.Println("generating the report")
			// A second replica trying now is told the job is taken:
			err := lock.TryRun(ctx, leader.DSN(exampleDSN()), key, lock.Options{Identity: "replica-2"},
				func(ctx context.Context) error { return nil })
			var held *lock.HeldError
			if errors.As(err, &held) {
				fmt.Println("replica-2 skipped; held by", held.Holder.Identity)
			}
			return nil
		})
	fmt.Println("replica-1:", err)
	// Output:
	// generating the report
	// replica-2 skipped; held by replica-1
	// replica-1: <nil>
}

// Idempotent webhook handling: a duplicate delivery that arrives while the
// first is being processed gets lock.ErrInProgress ("try later").
func ExampleRunTx() {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, exampleDSN())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close(ctx)
	const webhookEvents = 42 // a namespace
	err = lock.RunTx(ctx, conn, leader.PairKey(webhookEvents, 1001), func(ctx context.Context, tx pgx.Tx) error {
		// check whether event 1001 was processed, process it, record it
		fmt.Println("processing event 1001")
		return nil
	})
	fmt.Println(err)
	// Output:
	// processing event 1001
	// <nil>
}

// At most two replicas run the backfill at once: every replica calls
// TryRunN with the same n; a third is told the slots are taken.
func ExampleTryRunN() {
	ctx := context.Background()
	key := leader.KeyFromName("backfill")
	db := leader.DSN(exampleDSN())
	err := lock.TryRunN(ctx, db, key, 2, lock.Options{Identity: "replica-1"}, func(ctx context.Context, slot int) error {
		fmt.Println("replica-1 runs in slot", slot)
		return lock.TryRunN(ctx, db, key, 2, lock.Options{Identity: "replica-2"}, func(ctx context.Context, slot int) error {
			fmt.Println("replica-2 runs in slot", slot)
			err := lock.TryRunN(ctx, db, key, 2, lock.Options{Identity: "replica-3"}, func(context.Context, int) error { return nil })
			fmt.Println("replica-3:", errors.Is(err, lock.ErrHeld))
			return nil
		})
	})
	fmt.Println(err)
	// Output:
	// replica-1 runs in slot 0
	// replica-2 runs in slot 1
	// replica-3: true
	// <nil>
}
