package elector

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
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

// OnFullRound makes g call f on its session before each full round: a seam
// for what no other session can do, such as taking one lock from a live
// member.
func OnFullRound(g *Group, f func(ctx context.Context, conn *pgx.Conn)) {
	g.mu.Lock()
	g.testRound = f
	g.mu.Unlock()
}
