package lock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/leader"
	"github.com/pgleader/pgleader/lock"
)

func TestSlotKey(t *testing.T) {
	named := leader.KeyFromName("backfill")
	for _, c := range []struct {
		key  leader.Key
		i    int
		want leader.Key
	}{
		{named, 0, named},
		{named, 1, leader.KeyFromName("backfill#1")},
		{named, 7, leader.KeyFromName("backfill#7")},
		{leader.Int64Key(42), 2, leader.KeyFromName("42#2")},
		{leader.PairKey(7, 42), 1, leader.KeyFromName("7:42#1")},
	} {
		if got := lock.SlotKey(c.key, c.i); got != c.want {
			t.Errorf("SlotKey(%s, %d) = %s, want %s", c.key, c.i, got, c.want)
		}
	}
}

func TestTryRunNRefusesBadInput(t *testing.T) {
	dsn := leader.DSN(server(t).DSN())
	key := leader.KeyFromName(t.Name())
	nop := func(context.Context, int) error { return nil }
	for _, c := range []struct {
		name string
		n    int
		fn   func(context.Context, int) error
		opts lock.Options
		want string
	}{
		{"zero slots", 0, nop, lock.Options{}, "n must be between 1 and 1024, got 0"},
		{"too many slots", lock.MaxSlots + 1, nop, lock.Options{}, "got 1025"},
		{"nil fn", 3, nil, lock.Options{}, "nil fn"},
		{"negative wait", 3, nop, lock.Options{Wait: -time.Second}, "Wait must not be negative"},
	} {
		err := lock.TryRunN(context.Background(), dsn, key, c.n, c.opts, c.fn)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", c.name, err, c.want)
		}
	}
	if err := lock.TryRunN(context.Background(), dsn, leader.Key{}, 3, lock.Options{}, nop); err == nil {
		t.Error("an invalid key was accepted")
	}
}

// Ten runners on a semaphore of three slots, each holding its slot until
// the test lets it go: never more than three run at once, no two share a
// slot, the server shows exactly the runners' three locks, and all ten
// run in the end (each freed slot is taken by a waiting runner).
func TestTryRunNAdmitsAtMostN(t *testing.T) {
	srv := server(t)
	key := leader.KeyFromName(t.Name())
	const runners, slots = 10, 3
	var mu sync.Mutex
	inside := map[int]string{} // slot -> runner
	entered := make(chan string, runners)
	release := make(chan struct{})
	errs := make(chan error, runners)
	var wg sync.WaitGroup
	for r := range runners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("runner-%d", r)
			errs <- lock.TryRunN(context.Background(), leader.DSN(srv.DSN()), key, slots,
				lock.Options{Identity: id, Wait: 2 * waitLong}, func(ctx context.Context, slot int) error {
					mu.Lock()
					if other, busy := inside[slot]; busy || slot < 0 || slot >= slots || len(inside) >= slots {
						mu.Unlock()
						return fmt.Errorf("%s entered slot %d while %d were inside (slot held by %q)", id, slot, len(inside), other)
					}
					inside[slot] = id
					mu.Unlock()
					entered <- id
					select {
					case <-release:
					case <-ctx.Done():
						return context.Cause(ctx)
					}
					mu.Lock()
					delete(inside, slot)
					mu.Unlock()
					return nil
				})
		}()
	}
	c := conn(t)
	finished := 0
	for ran := 0; ran < runners; ran++ {
		for in := false; !in; {
			select {
			case <-entered:
				in = true
			case err := <-errs: // a runner let go earlier
				if err != nil {
					t.Fatalf("a runner failed: %v", err)
				}
				finished++
			case <-time.After(waitLong):
				t.Fatalf("%d of %d runners ran", ran, runners)
			}
		}
		if ran == slots-1 {
			// Three inside: the server shows three granted slot locks.
			var n int
			keys := []int64{}
			for i := range slots {
				v, _ := lock.SlotKey(key, i).Int64()
				keys = append(keys, v)
			}
			err := c.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks WHERE locktype='advisory' AND granted
				AND objsubid=1 AND ((classid::bigint << 32) | objid::bigint) = ANY($1)`, keys).Scan(&n)
			if err != nil || n != slots {
				t.Fatalf("slot locks granted: %d (%v), want %d", n, err, slots)
			}
		}
		if ran >= slots-1 {
			release <- struct{}{} // one leaves; a waiting runner takes its slot
		}
	}
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
		finished++
	}
	if finished != runners {
		t.Fatalf("%d of %d runners finished", finished, runners)
	}
}

// With every slot held by other sessions (here plain pg_advisory_lock
// calls, as any role may make), TryRunN skips at once with ErrHeld, and
// the first slot that frees is taken.
func TestTryRunNAllHeld(t *testing.T) {
	srv := server(t)
	key := leader.KeyFromName(t.Name())
	holders := make([]func(), 3)
	for i := range holders {
		c := conn(t)
		if _, err := c.Exec(context.Background(), "SELECT pg_advisory_lock($1::bigint)", must64(lock.SlotKey(key, i))); err != nil {
			t.Fatal(err)
		}
		holders[i] = func() { c.Exec(context.Background(), "SELECT pg_advisory_unlock_all()") }
	}
	ran := false
	err := lock.TryRunN(context.Background(), leader.DSN(srv.DSN()), key, 3, lock.Options{}, func(context.Context, int) error {
		ran = true
		return nil
	})
	if !errors.Is(err, lock.ErrHeld) || ran {
		t.Fatalf("all slots held: ran %v, err %v; want ErrHeld", ran, err)
	}
	// A fourth slot is free.
	got := -1
	if err := lock.TryRunN(context.Background(), leader.DSN(srv.DSN()), key, 4, lock.Options{}, func(_ context.Context, slot int) error {
		got = slot
		return nil
	}); err != nil || got != 3 {
		t.Fatalf("n=4: slot %d, err %v; want slot 3", got, err)
	}
	// A waiting caller gets slot 1 once its holder lets go.
	done := make(chan error, 1)
	slot := make(chan int, 1)
	go func() {
		done <- lock.TryRunN(context.Background(), leader.DSN(srv.DSN()), key, 3, lock.Options{Wait: waitLong}, func(_ context.Context, s int) error {
			slot <- s
			return nil
		})
	}()
	holders[1]()
	select {
	case s := <-slot:
		if s != 1 {
			t.Fatalf("took slot %d, want the freed slot 1", s)
		}
	case err := <-done:
		t.Fatalf("the waiting caller ended without running: %v", err)
	case <-time.After(waitLong):
		t.Fatal("the freed slot was not taken")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Slot 0 is the key itself: a TryRun holding the key fills a semaphore of
// one, and a semaphore of two runs on slot 1 beside it.
func TestTryRunNSlotZeroIsTheKey(t *testing.T) {
	dsn := leader.DSN(server(t).DSN())
	key := leader.KeyFromName(t.Name())
	err := lock.TryRun(context.Background(), dsn, key, lock.Options{Identity: "plain"}, func(ctx context.Context) error {
		err := lock.TryRunN(ctx, dsn, key, 1, lock.Options{}, func(context.Context, int) error { return errors.New("ran beside the holder") })
		var he *lock.HeldError
		if !errors.As(err, &he) || he.Holder.Identity != "plain" {
			return fmt.Errorf("n=1 beside TryRun: %v; want a HeldError naming plain", err)
		}
		return lock.TryRunN(ctx, dsn, key, 2, lock.Options{}, func(_ context.Context, slot int) error {
			if slot != 1 {
				return fmt.Errorf("n=2 beside TryRun ran on slot %d, want 1", slot)
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A caller waiting for a slot returns when its context ends.
func TestTryRunNWaitEndsWithContext(t *testing.T) {
	srv := server(t)
	key := leader.KeyFromName(t.Name())
	c := conn(t)
	if _, err := c.Exec(context.Background(), "SELECT pg_advisory_lock($1::bigint)", must64(key)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- lock.TryRunN(ctx, leader.DSN(srv.DSN()), key, 1, lock.Options{Identity: "patient", Wait: time.Hour}, func(context.Context, int) error {
			return errors.New("ran")
		})
	}()
	if err := waitForSession(c, "patient"); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want context.Canceled", err)
		}
	case <-time.After(waitLong):
		t.Fatal("TryRunN kept waiting after its context ended")
	}
}

// waitForSession waits until a session named identity is connected.
func waitForSession(c *pgx.Conn, identity string) error {
	deadline := time.Now().Add(waitLong)
	for time.Now().Before(deadline) {
		var n int
		if err := c.QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_activity WHERE application_name=$1", identity).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("no session %q", identity)
}

func must64(k leader.Key) int64 {
	v, ok := k.Int64()
	if !ok {
		panic("not a bigint key")
	}
	return v
}
