package leader

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Querier is what Holder needs: *pgx.Conn, *pgxpool.Pool and pgx.Tx all
// satisfy it.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Backend describes a backend that holds or waits for an advisory lock, as
// pg_locks and pg_stat_activity show it.
type Backend struct {
	// Identity is the session's application_name (an elector's identity).
	Identity string
	// PID is the backend's process id.
	PID uint32
	// User is the session's role name.
	User string
	// BackendStart is when the session started (zero when not visible).
	BackendStart time.Time
}

// HolderInfo is who holds a key and who waits for it.
type HolderInfo struct {
	// Held reports whether any session holds the key.
	Held bool
	// Holder is the session holding the key, when Held.
	Holder Backend
	// Waiters are the sessions queued for the key (pg_locks.granted =
	// false), oldest session first.
	Waiters []Backend
}

// Identity returns the holder's identity, or "" when the key is free.
func (h HolderInfo) Identity() string { return h.Holder.Identity }

// Holder returns who holds key in the current database, and who waits for
// it. It needs no table and no privilege beyond what every role has.
func Holder(ctx context.Context, q Querier, key Key) (HolderInfo, error) {
	classid, objid, objsubid := key.LockTag()
	rows, err := q.Query(ctx, `SELECT l.granted, l.pid, coalesce(a.application_name, ''), coalesce(a.usename::text, ''), a.backend_start
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.database = (SELECT datid FROM pg_stat_activity WHERE pid = pg_backend_pid())
  AND l.classid = $1 AND l.objid = $2 AND l.objsubid = $3
ORDER BY l.granted DESC, a.backend_start, l.pid`, classid, objid, objsubid)
	if err != nil {
		return HolderInfo{}, err
	}
	defer rows.Close()
	var h HolderInfo
	for rows.Next() {
		var granted bool
		var s Backend
		var pid int32
		var start *time.Time
		if err := rows.Scan(&granted, &pid, &s.Identity, &s.User, &start); err != nil {
			return HolderInfo{}, err
		}
		s.PID = uint32(pid)
		if start != nil {
			s.BackendStart = *start
		}
		if granted && !h.Held {
			h.Held, h.Holder = true, s
		} else if !granted {
			h.Waiters = append(h.Waiters, s)
		}
	}
	return h, rows.Err()
}
