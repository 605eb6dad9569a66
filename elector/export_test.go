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

// FollowerWait is e.followerWait, for its table test.
func FollowerWait(e *Elector, deadlock time.Duration) time.Duration { return e.followerWait(deadlock) }

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
