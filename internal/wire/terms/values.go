package terms

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// ValuesDDL returns the CREATE TABLE statement of a values table (see
// elector.Config.Value): a row per key, the value its leader proclaimed,
// stamped with the leader's backend (pid and session start) and identity.
// A reader pairs a row with the key's live holder on all three, so a row an
// earlier leader wrote is never read as the new leader's.
func ValuesDDL(table string) string {
	q := quoteLoose(table)
	return `CREATE TABLE IF NOT EXISTS ` + q + ` (
    classid       oid         NOT NULL,  -- the advisory lock, as in the terms table
    objid         oid         NOT NULL,
    objsubid      int2        NOT NULL,
    key_name      text        NOT NULL,
    holder        text        NOT NULL,  -- the leader's identity (its application_name)
    backend_pid   int4        NOT NULL,  -- the leader's backend
    backend_start timestamptz NOT NULL,  -- and when that backend's session started
    value         bytea       NOT NULL,
    proclaimed_at timestamptz NOT NULL,
    PRIMARY KEY (classid, objid, objsubid)
)`
}

// EnsureValues is Ensure for a values table.
func EnsureValues(ctx context.Context, conn *pgx.Conn, table string, o EnsureOptions) (Table, error) {
	return ensure(ctx, conn, table, o, ValuesDDL, "SELECT, INSERT, UPDATE")
}

// ProclaimSQL writes the value of a key for this session, as its leader.
// Its arguments are classid, objid, objsubid, key name, value. It runs on a
// lock session, under its pinned search_path, after a statement in the
// same transaction proved that the session holds the lock.
func ProclaimSQL(quoted string) string {
	return `INSERT INTO ` + quoted + ` AS v (classid, objid, objsubid, key_name, holder, backend_pid, backend_start, value, proclaimed_at)
SELECT $1::oid, $2::oid, $3::int2, $4::text, current_setting('application_name'), pg_backend_pid(), a.backend_start, $5::bytea, now()
FROM pg_stat_get_activity(pg_backend_pid()) a
ON CONFLICT (classid, objid, objsubid) DO UPDATE SET key_name = EXCLUDED.key_name, holder = EXCLUDED.holder,
  backend_pid = EXCLUDED.backend_pid, backend_start = EXCLUDED.backend_start, value = EXCLUDED.value, proclaimed_at = EXCLUDED.proclaimed_at`
}
