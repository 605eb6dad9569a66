package group

import (
	"context"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
)

// wire is what a member needs of its main session: the wire layer
// (lockconn.Member) implements it against PostgreSQL, and the tests script
// it to reach what a real server rarely does.
type wire interface {
	PID() uint32
	Close()
	// Join takes the roster lock (false: another session holds it
	// exclusively; RosterHolder says who).
	Join(ctx context.Context) (bool, error)
	RosterHolder(ctx context.Context) (lockconn.SpaceHolder, error)
	// Round is a full round: the check and, when scan is set, the scan of
	// pg_locks, in one round trip.
	Round(ctx context.Context, marker string, scan bool) (lockconn.Scan, error)
	// Direct: no proxy stands between (lockconn.Session.Direct); Ping, a
	// full round without a statement, is allowed only then.
	Direct() bool
	Ping(ctx context.Context) error
	Exchange(ctx context.Context, x lockconn.Exchange) (won []tag, unlocked bool, err error)
	Bump(ctx context.Context, won []tag, names []string) (map[tag]int64, error)
	Broadcast(ctx context.Context, msgs []lockconn.GroupMessage, marker string) error
	Leave(ctx context.Context) error
	// Wait reads the idle session: the next notification.
	Wait(ctx context.Context) (*pgconn.Notification, error)
	IsGroupChannel(channel string) bool
}

var _ wire = (*lockconn.Member)(nil)
