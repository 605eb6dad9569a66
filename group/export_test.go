package group

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/leader"
)

// OnFullRound makes g call f on its session before each full round: a seam
// for what no other session can do, such as taking one lock from a live
// member.
func OnFullRound(g *Group, f func(ctx context.Context, conn *pgx.Conn)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.testRound = func(ctx context.Context, w wire) {
		if m, ok := w.(*lockconn.Member); ok {
			f(ctx, m.Conn())
		}
	}
}

// PaceScans makes g scan at most once per every after its first scan, as
// a large group does (at 100,000 keys, about every 20 s): the full rounds
// between prove the session alone. Call it before Run.
func PaceScans(g *Group, every time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.testScanEvery = every
}

// SuccessorOf is the member that gets key when me resigns it, among members.
func SuccessorOf(key leader.Key, members []string, me string) string {
	return successorOf(tagOf(key), members, me)
}
