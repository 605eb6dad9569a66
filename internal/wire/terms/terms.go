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

// DDL returns the CREATE TABLE statement of a terms table, named table
// ("name" or "schema.name", quoted here) or already quoted.
func DDL(table string) string {
	q := quoteLoose(table)
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

// quoteLoose quotes a raw name, and keeps one that is already quoted.
func quoteLoose(table string) string {
	if strings.HasPrefix(table, `"`) {
		return table
	}
	if q, err := Quote(table); err == nil {
		return q
	}
	return table
}

// lastPart is a table name's last part, unquoted.
func lastPart(table string) string {
	if strings.HasPrefix(table, `"`) {
		if i := strings.LastIndex(table, `."`); i >= 0 {
			table = table[i+1:]
		}
		return strings.ReplaceAll(strings.Trim(table, `"`), `""`, `"`)
	}
	if i := strings.LastIndex(table, "."); i >= 0 {
		return table[i+1:]
	}
	return table
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

// ErrForeignTable is wrapped when the table exists but belongs to a role
// this session's role is not a member of: that role could rewrite the
// terms (rewind one, and an old leader's writes pass its fence) or the
// history.
var ErrForeignTable = errors.New("pgleader: the table belongs to another role")

// Table is a terms or history table as a session found or created it.
type Table struct{ Schema, Name string }

// Quoted is the table's schema-qualified, quoted name.
func (t Table) Quoted() string { return pgx.Identifier{t.Schema, t.Name}.Sanitize() }

// Raw is "schema.name", the form Quote reads back (when neither part holds
// a dot; otherwise the configured name).
func (t Table) Raw(configured string) string {
	if strings.Contains(t.Schema, ".") || strings.Contains(t.Name, ".") {
		return configured
	}
	return t.Schema + "." + t.Name
}

// EnsureOptions say how Ensure treats a missing or foreign table.
type EnsureOptions struct {
	// Create creates a missing table.
	Create bool
	// Schemas are the schemas of the role's own search_path (see
	// lockconn.Session.Schemas), where a table named without a schema is
	// looked for, and created in the first.
	Schemas []string
	// TrustedOwner is a role, besides this role and the roles it is a
	// member of, whose table is used.
	TrustedOwner string
}

// Ensure finds the terms table, or creates it when o.Create is set, and
// returns where it is. A table named without a schema is looked for in
// o.Schemas in order (the role's own search_path; the session itself runs
// with a pinned one), as PostgreSQL would. A table another role owns
// (one this role is not a member of, not a superuser, and not
// o.TrustedOwner) is refused with ErrForeignTable: whoever owns it can
// rewrite the terms.
func Ensure(ctx context.Context, conn *pgx.Conn, table string, o EnsureOptions) (Table, error) {
	return ensure(ctx, conn, table, o, DDL, "SELECT, INSERT, UPDATE")
}

// EnsureHistory is Ensure for a history table.
func EnsureHistory(ctx context.Context, conn *pgx.Conn, table string, o EnsureOptions) (Table, error) {
	return ensure(ctx, conn, table, o, HistoryDDL, "SELECT, INSERT, UPDATE, DELETE")
}

// findSQL looks a table up in schemas, in order. It runs on a session with
// a pinned search_path.
// It reports whether the table is trusted: its owner is this role, a role
// it is a member of, or a superuser (who could rewrite any table anyway).
const findSQL = `SELECT n.nspname::text, c.relname::text, r.rolname::text, pg_has_role(c.relowner, 'MEMBER') OR r.rolsuper
FROM unnest($1::text[]) WITH ORDINALITY AS s(nsp, i)
JOIN pg_namespace n ON n.nspname = s.nsp
JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = $2
JOIN pg_roles r ON r.oid = c.relowner
ORDER BY s.i LIMIT 1`

// Find looks the table up as Ensure does, and creates nothing: found is
// false when it does not exist. A foreign table gives ErrForeignTable.
func Find(ctx context.Context, conn *pgx.Conn, table string, o EnsureOptions) (t Table, found bool, err error) {
	schemas, name, err := split(table, o.Schemas)
	if err != nil {
		return Table{}, false, err
	}
	var owner string
	var member bool
	err = conn.QueryRow(ctx, findSQL, schemas, name).Scan(&t.Schema, &t.Name, &owner, &member)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Table{}, false, nil
	case err != nil:
		return Table{}, false, err
	case !member && owner != o.TrustedOwner:
		return Table{}, false, fmt.Errorf("%w: %s is owned by role %q, which this role is not a member of (its owner can rewrite what it holds); drop it and let pgleader create its own, or name %q in Fencing.TrustedOwner if that role may", ErrForeignTable, t.Quoted(), owner, owner)
	}
	return t, true, nil
}

// split returns where to look for table: its own schema, or schemas.
func split(table string, schemas []string) ([]string, string, error) {
	if _, err := Quote(table); err != nil {
		return nil, "", err
	}
	if s, n, ok := strings.Cut(table, "."); ok {
		return []string{s}, n, nil
	}
	if schemas == nil {
		schemas = []string{}
	}
	return schemas, table, nil
}

func ensure(ctx context.Context, conn *pgx.Conn, table string, o EnsureOptions, ddl func(string) string, privileges string) (Table, error) {
	schemas, name, err := split(table, o.Schemas)
	if err != nil {
		return Table{}, err
	}
	for attempt := 1; ; attempt++ {
		t, found, err := Find(ctx, conn, table, o)
		switch {
		case err != nil:
			return Table{}, err
		case found:
			// Prove access now rather than at the first election.
			_, err := conn.Exec(ctx, `SELECT 1 FROM `+t.Quoted()+` LIMIT 0`)
			return t, classify(err, table, ddl(t.Quoted()), privileges)
		case !o.Create:
			return Table{}, classify(&pgconn.PgError{Code: "42P01", Message: "relation does not exist"}, table, ddl(table), privileges)
		case len(schemas) == 0:
			return Table{}, fmt.Errorf("%w: %s: the role's search_path names no schema that exists, so there is nowhere to create it; name its schema (schema.table)", ErrNoTable, table)
		}
		t = Table{Schema: schemas[0], Name: name}
		// The simple protocol: a DDL may hold more than one statement.
		_, err = conn.Exec(ctx, ddl(t.Quoted()), pgx.QueryExecModeSimpleProtocol)
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
			return t, nil
		case errors.As(err, &pgErr) && (pgErr.Code == "23505" || pgErr.Code == "42P07"):
			// Concurrent CREATE TABLE IF NOT EXISTS can race on the
			// catalogs: look again (and check the owner).
		case errors.As(err, &pgErr) && (pgErr.Code == "55P03" || pgErr.Code == "40P01") && ctx.Err() == nil:
			// Another session creating the same table holds the catalog
			// locks longer than this session's lock_timeout: once it has
			// committed, the table is found.
		default:
			return Table{}, classify(err, table, ddl(t.Quoted()), privileges)
		}
		if attempt >= 5 {
			return Table{}, classify(err, table, ddl(t.Quoted()), privileges)
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
// objid, objsubid. It runs in the caller's transaction, under the caller's
// search_path: its types and operators name pg_catalog.
func FenceSQL(quoted string) string {
	return `SELECT term FROM ` + quoted + ` WHERE classid OPERATOR(pg_catalog.=) $1::pg_catalog.oid AND objid OPERATOR(pg_catalog.=) $2::pg_catalog.oid AND objsubid OPERATOR(pg_catalog.=) $3::pg_catalog.int2 FOR SHARE`
}

// HistoryDDL returns the statements that create a history table: a row
// per term of every key, indexed by key and term (the primary key) and by
// election time (for retention and for reading a recent window).
func HistoryDDL(table string) string {
	q := quoteLoose(table)
	// CREATE INDEX names no schema: the index goes with its table.
	idx := pgx.Identifier{lastPart(table) + "_elected_at"}.Sanitize()
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
