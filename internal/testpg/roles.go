package testpg

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Roles are two roles made for one test on a shared database: App, the
// role pgleader runs as, and Evil, a hostile LOGIN role with no membership
// and no grant but what PUBLIC has. Whatever Evil says (NOTIFY) or holds
// (any advisory lock, pgleader's own space included) must not make
// pgleader lead, yield, queue or report a leader the server does not
// prove.
type Roles struct {
	App, Evil       string // role names
	AppDSN, EvilDSN string
	srv             *Server
}

var roleSeq atomic.Int64

// NewRoles creates both roles; at cleanup their sessions are ended and the
// roles dropped with everything they own.
func NewRoles(t testing.TB, srv *Server) *Roles {
	t.Helper()
	n := roleSeq.Add(1)
	r := &Roles{App: fmt.Sprintf("app_%d", n), Evil: fmt.Sprintf("evil_%d", n), srv: srv}
	r.AppDSN, r.EvilDSN = RoleDSN(srv, r.App), RoleDSN(srv, r.Evil)
	ctx := context.Background()
	for _, role := range []string{r.App, r.Evil} {
		if err := srv.Exec(ctx, "CREATE ROLE "+role+" LOGIN"); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		srv.Exec(ctx, "REVOKE CREATE ON SCHEMA public FROM "+r.Evil)
		srv.Exec(ctx, "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE usename IN ($1, $2)", r.App, r.Evil)
		srv.Exec(ctx, "DROP OWNED BY "+r.Evil+", "+r.App)
		srv.Exec(ctx, "DROP ROLE IF EXISTS "+r.Evil)
		srv.Exec(ctx, "DROP ROLE IF EXISTS "+r.App)
	})
	return r
}

// RoleDSN is srv's connection string for role (trusted: no password).
func RoleDSN(srv *Server, role string) string {
	return strings.Replace(srv.DSN(), "postgres://postgres@", "postgres://"+role+"@", 1)
}

// EvilConn connects as the hostile role, until the test ends.
func (r *Roles) EvilConn(t testing.TB) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), r.EvilDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// FillLockTable has conn take advisory locks, 50 a statement, until the
// server's shared lock table is full (SQLSTATE 53200); it returns how many
// it holds. The locks are conn's until it closes or unlocks them all.
func FillLockTable(t testing.TB, conn *pgx.Conn) int {
	t.Helper()
	held := 0
	for i := 0; ; i += 50 {
		_, err := conn.Exec(context.Background(), "SELECT pg_advisory_lock(k) FROM generate_series($1::int8, $1::int8 + 49) k", int64(1<<40+i))
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "53200" {
			return held
		}
		if err != nil {
			t.Fatal(err)
		}
		held += 50
	}
}

// Shadow sets App's search_path to put public before pg_catalog, lets Evil
// create objects in public, and has Evil shadow the advisory-lock
// functions and pg_locks there: every try succeeds, every wait returns at
// once, every probe says the lock is free, and pg_locks is empty.
// Unqualified names in App's sessions then reach Evil's objects.
func (r *Roles) Shadow(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	for _, q := range []string{
		"ALTER ROLE " + r.App + " SET search_path = public, pg_catalog",
		"GRANT CREATE ON SCHEMA public TO " + r.Evil,
	} {
		if err := r.srv.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	evil := r.EvilConn(t)
	for _, q := range []string{
		`CREATE FUNCTION public.pg_try_advisory_lock(int8) RETURNS bool LANGUAGE sql AS 'SELECT true'`,
		`CREATE FUNCTION public.pg_try_advisory_lock(int4, int4) RETURNS bool LANGUAGE sql AS 'SELECT true'`,
		`CREATE FUNCTION public.pg_advisory_lock(int8) RETURNS void LANGUAGE sql AS ''`,
		`CREATE FUNCTION public.pg_try_advisory_lock_shared(int8) RETURNS bool LANGUAGE sql AS 'SELECT true'`,
		`CREATE FUNCTION public.pg_advisory_unlock_shared(int8) RETURNS bool LANGUAGE sql AS 'SELECT true'`,
		`CREATE FUNCTION public.pg_advisory_unlock(int8) RETURNS bool LANGUAGE sql AS 'SELECT true'`,
		`CREATE FUNCTION public.pg_advisory_unlock(int4, int4) RETURNS bool LANGUAGE sql AS 'SELECT true'`,
		`CREATE FUNCTION public.pg_try_advisory_xact_lock(int8) RETURNS bool LANGUAGE sql AS 'SELECT true'`,
		`CREATE FUNCTION public.pg_advisory_xact_lock(int8) RETURNS void LANGUAGE sql AS ''`,
		`CREATE VIEW public.pg_locks AS SELECT * FROM pg_catalog.pg_locks WHERE false`,
		`GRANT SELECT ON public.pg_locks TO PUBLIC`,
	} {
		if _, err := evil.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
}

// ConnectAs connects to dsn as a session whose application_name is app
// (any string: a ranked candidate's name, a forged one), closed when the
// test ends.
func ConnectAs(t testing.TB, dsn, app string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = app
	c, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}
