package main

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/internal/wire/terms"
)

// dial connects for a CLI command. The session's search_path is pinned
// (see lockconn.PinnedPath), so that nothing another role created in a
// schema of the user's search_path can stand in for a built-in; the
// role's own schemas are kept to find pgleader's tables.
func dial(ctx context.Context, dsn string) (*pgx.Conn, []string, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, nil, err
	}
	schemas, err := lockconn.Pin(ctx, conn)
	if err != nil {
		conn.Close(context.Background())
		return nil, nil, err
	}
	return conn, schemas, nil
}

// readable returns a pgleader table's quoted name for reading, found in the
// role's schemas as an elector finds it, or "" when it does not exist, this
// role may not read it, or it belongs to a role this one is not a member of
// (whose rows could say anything; err says so).
func readable(ctx context.Context, conn *pgx.Conn, schemas []string, table string) (string, error) {
	t, found, err := terms.Find(ctx, conn, table, terms.EnsureOptions{Schemas: schemas})
	if err != nil || !found {
		return "", err
	}
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT has_table_privilege($1, 'SELECT')`, t.Quoted()).Scan(&ok); err != nil {
		return "", err
	}
	if !ok {
		return "", nil
	}
	return t.Quoted(), nil
}

// optional is readable for a table the command can do without: a foreign
// table is skipped, as is a missing one.
func optional(ctx context.Context, conn *pgx.Conn, schemas []string, table string) string {
	q, err := readable(ctx, conn, schemas, table)
	if errors.Is(err, terms.ErrForeignTable) || err != nil {
		return ""
	}
	return q
}
