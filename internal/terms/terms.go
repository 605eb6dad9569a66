// Package terms holds the SQL of the fencing-terms table, shared by the
// leader package (Fence) and the elector (installing a term).
package terms

import (
	"context"
	"errors"
	"fmt"
	"strings"

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
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "42P01", "3F000": // undefined_table, invalid_schema_name
			return fmt.Errorf("%w: %s does not exist; turn on table creation, or create it:\n%s;\n(%w)", ErrNoTable, table, DDL(table), err)
		case "42501": // insufficient_privilege
			return fmt.Errorf("%w: no privilege on %s; grant SELECT, INSERT, UPDATE on it to this role, or CREATE on its schema (%w)", ErrNoTable, table, err)
		case "25006": // read_only_sql_transaction
			return fmt.Errorf("%w: check default_transaction_read_only for this role and database, or turn fencing off (%w)", ErrReadOnly, err)
		}
	}
	return err
}

// Ensure checks that the table exists, and creates it when create is set.
func Ensure(ctx context.Context, conn *pgx.Conn, table string, create bool) error {
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
		return Classify(err, table)
	}
	if !create {
		return Classify(&pgconn.PgError{Code: "42P01", Message: "relation does not exist"}, table)
	}
	if _, err := conn.Exec(ctx, DDL(table)); err != nil {
		var pgErr *pgconn.PgError
		// Concurrent CREATE TABLE IF NOT EXISTS can race on the catalogs.
		if errors.As(err, &pgErr) && (pgErr.Code == "23505" || pgErr.Code == "42P07") {
			return nil
		}
		return Classify(err, table)
	}
	return nil
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
