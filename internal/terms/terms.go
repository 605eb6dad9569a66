// Package terms holds the SQL of the fencing-terms table, shared by the
// leader package (Fence) and the elector (installing a term).
package terms

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNoTable is wrapped when the table is missing or not accessible.
var ErrNoTable = errors.New("pgleader: fencing terms table missing or not accessible")

// ErrReadOnly is wrapped when the database refuses writes to the table
// (SQLSTATE 25006: default_transaction_read_only, or a read-only role).
var ErrReadOnly = errors.New("pgleader: the database is read-only for this session, so fencing terms cannot be written")

// Quote quotes a table name given as "table" or "schema.table".
func Quote(table string) (string, error) {
	parts := strings.Split(table, ".")
	if len(parts) > 2 {
		return "", fmt.Errorf("table %q: want table or schema.table", table)
	}
	for _, p := range parts {
		if p == "" {
			return "", fmt.Errorf("table %q: empty name part", table)
		}
	}
	return pgx.Identifier(parts).Sanitize(), nil
}

// DDL returns the CREATE TABLE statement of a terms table.
func DDL(table string) string {
	q, err := Quote(table)
	if err != nil {
		q = table
	}
	return `CREATE TABLE IF NOT EXISTS ` + q + ` (
    classid    oid         NOT NULL,  -- pg_locks.classid of the advisory lock
    objid      oid         NOT NULL,  -- pg_locks.objid
    objsubid   int2        NOT NULL,  -- pg_locks.objsubid (1: bigint key, 2: pair key)
    key_name   text        NOT NULL,  -- the key as leader.Key.String renders it
    term       bigint      NOT NULL,  -- the fencing token of the current tenure
    holder     text        NOT NULL,  -- the elector's identity
    elected_at timestamptz NOT NULL,
    PRIMARY KEY (classid, objid, objsubid)
)`
}

// Classify turns a missing table or privilege into ErrNoTable, and a
// read-only session into ErrReadOnly, with guidance; it passes other errors
// through. The server's error stays in the chain (errors.As finds the
// *pgconn.PgError).
func Classify(err error, table string) error {
	return classify(err, table, DDL(table), "SELECT, INSERT, UPDATE")
}

func classify(err error, table, ddl, privileges string) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "42P01", "3F000": // undefined_table, invalid_schema_name
			return fmt.Errorf("%w: %s does not exist; turn on table creation, or create it:\n%s;\n(%w)", ErrNoTable, table, ddl, err)
		case "42501": // insufficient_privilege
			return fmt.Errorf("%w: no privilege on %s; grant %s on it to this role, or CREATE on its schema (%w)", ErrNoTable, table, privileges, err)
		case "25006": // read_only_sql_transaction
			return fmt.Errorf("%w: check default_transaction_read_only for this role and database, or turn fencing off (%w)", ErrReadOnly, err)
		}
	}
	return err
}

// Ensure checks that the terms table exists, and creates it when create
// is set.
func Ensure(ctx context.Context, conn *pgx.Conn, table string, create bool) error {
	return ensure(ctx, conn, table, create, DDL(table), "SELECT, INSERT, UPDATE")
}

// EnsureHistory is Ensure for a history table.
func EnsureHistory(ctx context.Context, conn *pgx.Conn, table string, create bool) error {
	return ensure(ctx, conn, table, create, HistoryDDL(table), "SELECT, INSERT, UPDATE, DELETE")
}

func ensure(ctx context.Context, conn *pgx.Conn, table string, create bool, ddl, privileges string) error {
	q, err := Quote(table)
	if err != nil {
		return err
	}
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, q).Scan(&exists); err != nil {
		return err
	}
	if exists {
		// Prove access now rather than at the first election.
		_, err := conn.Exec(ctx, `SELECT 1 FROM `+q+` LIMIT 0`)
		return classify(err, table, ddl, privileges)
	}
	if !create {
		return classify(&pgconn.PgError{Code: "42P01", Message: "relation does not exist"}, table, ddl, privileges)
	}
	// The simple protocol: a DDL may hold more than one statement.
	for attempt := 1; ; attempt++ {
		_, err := conn.Exec(ctx, ddl, pgx.QueryExecModeSimpleProtocol)
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &pgErr) && (pgErr.Code == "23505" || pgErr.Code == "42P07"):
			// Concurrent CREATE TABLE IF NOT EXISTS can race on the catalogs.
			return nil
		case errors.As(err, &pgErr) && (pgErr.Code == "55P03" || pgErr.Code == "40P01") && attempt < 5 && ctx.Err() == nil:
			// Another session creating the same table holds the catalog
			// locks longer than this session's lock_timeout: once it has
			// committed, IF NOT EXISTS finds the table.
			continue
		default:
			return classify(err, table, ddl, privileges)
		}
	}
}

// BumpSQL installs the next term of a key and returns it. Its arguments are
// classid, objid, objsubid, key name, holder.
func BumpSQL(quoted string) string {
	return `INSERT INTO ` + quoted + ` AS t (classid, objid, objsubid, key_name, term, holder, elected_at)
VALUES ($1::oid, $2::oid, $3::int2, $4::text, 1, $5::text, now())
ON CONFLICT (classid, objid, objsubid) DO UPDATE SET term = t.term + 1, holder = EXCLUDED.holder, elected_at = EXCLUDED.elected_at
RETURNING term`
}

// FenceSQL reads a key's term with a share lock. Its arguments are classid,
// objid, objsubid.
func FenceSQL(quoted string) string {
	return `SELECT term FROM ` + quoted + ` WHERE classid = $1::oid AND objid = $2::oid AND objsubid = $3::int2 FOR SHARE`
}

// HistoryDDL returns the statements that create a history table: a row
// per term of every key, indexed by key and term (the primary key) and by
// election time (for retention and for reading a recent window).
func HistoryDDL(table string) string {
	q, err := Quote(table)
	if err != nil {
		q = table
	}
	idx := pgx.Identifier{strings.ReplaceAll(strings.Trim(table, `"`), ".", "_") + "_elected_at"}.Sanitize()
	if parts := strings.Split(table, "."); len(parts) == 2 {
		// CREATE INDEX names no schema: the index goes with its table.
		idx = pgx.Identifier{parts[1] + "_elected_at"}.Sanitize()
	}
	return `CREATE TABLE IF NOT EXISTS ` + q + ` (
    classid     oid         NOT NULL,  -- the advisory lock, as in the terms table
    objid       oid         NOT NULL,
    objsubid    int2        NOT NULL,
    key_name    text        NOT NULL,
    term        bigint      NOT NULL,
    holder      text        NOT NULL,  -- the elector's identity
    backend_pid int4        NOT NULL,
    elected_at  timestamptz NOT NULL,
    demoted_at  timestamptz,           -- NULL while the term lasts, or when nobody recorded its end
    reason      text,                  -- resigned, callback_returned, connection_lost, lock_lost, ... or superseded
    detail      text,                  -- the reason's message
    PRIMARY KEY (classid, objid, objsubid, term)
);
CREATE INDEX IF NOT EXISTS ` + idx + ` ON ` + q + ` (elected_at)`
}

// BumpHistorySQL is BumpSQL that also, in the same statement, opens the
// new term's history row, closes an earlier term of the key whose end
// nobody recorded ("superseded"), and deletes up to 100 rows older than
// retention (skipping rows another session is deleting).
func BumpHistorySQL(quoted, history string, retention time.Duration) string {
	return `WITH nt AS (` + BumpSQL(quoted) + `),
h AS (INSERT INTO ` + history + ` (classid, objid, objsubid, key_name, term, holder, backend_pid, elected_at)
  SELECT $1::oid, $2::oid, $3::int2, $4::text, nt.term, $5::text, pg_backend_pid(), now() FROM nt),
s AS (UPDATE ` + history + ` SET demoted_at = now(), reason = 'superseded', detail = 'a newer term began before this one recorded its end'
  WHERE classid = $1::oid AND objid = $2::oid AND objsubid = $3::int2 AND demoted_at IS NULL AND term < (SELECT term FROM nt)),
d AS (DELETE FROM ` + history + ` WHERE ctid = ANY (ARRAY(SELECT ctid FROM ` + history + `
  WHERE elected_at < now() - make_interval(secs => ` + fmt.Sprint(int64(retention.Seconds())) + `) LIMIT 100 FOR UPDATE SKIP LOCKED)))
SELECT term FROM nt`
}

// DemotedSQL records the end of a term in a history table. Its arguments
// are classid, objid, objsubid, term, demoted_at, reason, detail.
func DemotedSQL(history string) string {
	return `UPDATE ` + history + ` SET demoted_at = $5, reason = $6, detail = $7
WHERE classid = $1::oid AND objid = $2::oid AND objsubid = $3::int2 AND term = $4`
}
