package lock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/leader"
)

// MaxSlots bounds TryRunN's n: each slot is one advisory lock, and a
// caller that finds them all held tries each in turn.
const MaxSlots = 1024

// SlotKey is slot i of the semaphore on key: key itself for slot 0 (so a
// semaphore of one slot is the plain lock TryRun takes), and for i > 0 the
// key made from the name "NAME#i", where NAME is key's name, or its
// number ("42", "7:42") for a key not made from a name. pgleader status
// shows slot i of "backfill" as "backfill#i".
func SlotKey(key leader.Key, i int) leader.Key { return leader.SlotKey(key, i) }

// TryRunN runs fn once while holding one of the n slots of the semaphore
// on key (slot i is SlotKey(key, i)): at most n callers with the same key
// and n run fn at once, on any number of processes. Every caller must pass
// the same n: the slots are n separate locks, so callers passing 3 and 5
// share slots 0 to 2 and together admit 5.
//
// It tries the slots in order, one round trip each, and runs fn on the
// first it gets, with the slot's number; fn is then checked, cancelled
// and released exactly as with TryRun. When every slot is held it returns
// a *HeldError for slot 0 (errors.Is ErrHeld), or, with opts.Wait, tries
// again with a jittered backoff (from 20 ms to 1 s) until Wait has passed.
// Waiting takes no place in any lock's queue, so it never delays a caller
// of TryRun on slot 0, and it leaves no line in the server's log; a freed
// slot is taken within the backoff's step, not at the lock manager's
// speed.
func TryRunN(ctx context.Context, c leader.Connector, key leader.Key, n int, opts Options, fn func(ctx context.Context, slot int) error) error {
	switch {
	case fn == nil:
		return errors.New("pgleader: TryRunN: nil fn")
	case n < 1 || n > MaxSlots:
		return fmt.Errorf("pgleader: TryRunN: n must be between 1 and %d, got %d", MaxSlots, n)
	}
	ls, err := opts.open(ctx, c, key, "TryRunN")
	if err != nil {
		return err
	}
	defer ls.Close()
	start := time.Now()
	slot, target, err := takeSlot(ctx, ls, key, n, opts.Wait, opts.LeaseDuration/2)
	opts.Observer.LockWaited(key, time.Since(start), err == nil && target != nil)
	if err != nil {
		return fmt.Errorf("pgleader: TryRunN: %w", err)
	}
	if target == nil {
		return heldError(ctx, ls, key, opts.LeaseDuration/2)
	}
	return confirmAndRun(ctx, ls, target, opts, func(ctx context.Context) error { return fn(ctx, slot) })
}

// takeSlot tries each slot once per pass (pg_try_advisory_lock: no queue,
// no lock_timeout; each round trip bounded by limit), and passes again
// after a jittered backoff until wait has passed. It returns a nil target
// when no slot was free.
func takeSlot(ctx context.Context, ls *lockconn.Lease, key leader.Key, n int, wait, limit time.Duration) (int, *lockconn.Target, error) {
	until := time.Now().Add(wait)
	step := 20 * time.Millisecond
	for {
		for i := range n {
			t := lockconn.NewTarget(SlotKey(key, i), "", "", "")
			rctx, cancel := context.WithTimeout(ctx, limit)
			held, err := acquire(rctx, ls, t, false)
			cancel()
			if err != nil {
				return 0, nil, err
			}
			if held {
				return i, t, nil
			}
		}
		left := time.Until(until)
		if left <= 0 {
			return 0, nil, nil
		}
		pause := min(step/2+rand.N(step/2+1), left)
		select {
		case <-ctx.Done():
			return 0, nil, context.Cause(ctx)
		case <-time.After(pause):
		}
		step = min(2*step, time.Second)
	}
}
