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
	// Identity is the session's application_name (an elector's identity),
	// without the rank a ranked candidate's carries (see Rank).
	Identity string
	// Rank is a ranked candidate's rank, from its application_name; nil
	// for an unranked one (see ParseApplicationName).
	Rank *Rank
	// PID is the backend's process id.
	PID uint32
	// User is the session's role name.
	User string
	// BackendStart is when the session started (zero when not visible).
	BackendStart time.Time
}

// HolderInfo is who holds a key and who waits for it.
type HolderInfo struct {
	// Held reports whether a session holds the key exclusively, as a
	// leader does.
	Held bool
	// Holder is the session holding the key exclusively, when Held.
	Holder Backend
	// Sharers are the sessions holding the key in share mode, oldest
	// session first. They lead nothing, but while any holds it nobody can
	// take the key exclusively: an application's (or another role's)
	// pg_advisory_lock_shared blocks the election. A follower's probe
	// shows here for an instant while the key is free.
	Sharers []Backend
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
	// Holder runs on the caller's connection, under the caller's
	// search_path, which may put a schema other roles can create objects
	// in before pg_catalog: every function, relation, type and operator is
	// named with its schema.
	// It reads the sessions with pg_stat_get_activity, not the
	// pg_stat_activity view, whose joins lock shared catalogs: it answers
	// while another role fills the server's lock table.
	rows, err := q.Query(ctx, `SELECT l.granted, l.mode OPERATOR(pg_catalog.=) 'ExclusiveLock', l.pid, coalesce(a.application_name, ''),
  coalesce(pg_catalog.pg_get_userbyid(a.usesysid)::pg_catalog.text, ''), a.backend_start
FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_get_activity(NULL) a ON a.pid OPERATOR(pg_catalog.=) l.pid
WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'
  AND l.database OPERATOR(pg_catalog.=) (SELECT datid FROM pg_catalog.pg_stat_get_activity(pg_catalog.pg_backend_pid()))
  AND l.classid OPERATOR(pg_catalog.=) $1::pg_catalog.oid AND l.objid OPERATOR(pg_catalog.=) $2::pg_catalog.oid AND l.objsubid OPERATOR(pg_catalog.=) $3::pg_catalog.int2
ORDER BY l.granted DESC, a.backend_start, l.pid`, classid, objid, objsubid)
	if err != nil {
		return HolderInfo{}, err
	}
	defer rows.Close()
	var h HolderInfo
	for rows.Next() {
		var granted, exclusive bool
		var s Backend
		var pid int32
		var start *time.Time
		if err := rows.Scan(&granted, &exclusive, &pid, &s.Identity, &s.User, &start); err != nil {
			return HolderInfo{}, err
		}
		s.PID = uint32(pid)
		if id, r, ok := ParseApplicationName(s.Identity); ok {
			s.Identity, s.Rank = id, &r
		}
		if start != nil {
			s.BackendStart = *start
		}
		switch {
		case !granted:
			h.Waiters = append(h.Waiters, s)
		case !exclusive:
			h.Sharers = append(h.Sharers, s)
		case !h.Held:
			h.Held, h.Holder = true, s
		}
	}
	return h, rows.Err()
}
