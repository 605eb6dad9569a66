package elector

import (
	"context"
	"time"
)

// Lease is the lease interface, for the scripted tests of package
// elector_test.
type Lease = lease

// UseLease makes e open ls instead of a real session.
func UseLease(e *Elector, ls Lease) {
	e.open = func(context.Context) (lease, error) { return ls, nil }
}

// Spread is e.spread, for its table test.
func Spread(e *Elector, deadlock time.Duration) time.Duration { return e.spread(deadlock) }

// HeirWait is e.heirWait.
func HeirWait(e *Elector) time.Duration { return e.heirWait() }

// SetObservePoll sets Observe's holder lookup interval; it returns the
// previous one.
func SetObservePoll(d time.Duration) time.Duration {
	old := observePoll
	observePoll = d
	return old
}

// SemaphoreCallbacks returns the callbacks s gives slot i's Elector: a
// seam to drive two slots granted at nearly the same moment.
func SemaphoreCallbacks(s *Semaphore, i int) Callbacks { return s.callbacks(i) }

// WrapLease makes e open its real sessions, each passed through wrap.
func WrapLease(e *Elector, wrap func(Lease) Lease) {
	open := e.openLease
	e.open = func(ctx context.Context) (lease, error) {
		ls, err := open(ctx)
		if err != nil {
			return nil, err
		}
		return wrap(ls), nil
	}
}

// SetFullProofEvery sets how many renews go between two that read
// pg_locks; it returns the value before.
func SetFullProofEvery(n int) int {
	old := fullProofEvery
	fullProofEvery = n
	return old
}

// SetReserveAhead sets how long before a preference handover is due the
// leader reserves the lock; it returns the value before.
func SetReserveAhead(d time.Duration) time.Duration {
	old := reserveAhead
	reserveAhead = d
	return old
}
