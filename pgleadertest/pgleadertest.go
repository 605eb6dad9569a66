// Package pgleadertest runs a throwaway PostgreSQL server for the tests of
// programs that use pgleader, with the faults such a program must survive:
// its leader's backend terminated, the server restarted. Import it from
// _test.go files, or from a demo program (Database): pgleader's own
// packages never import it.
//
// The server is the system's own PostgreSQL (initdb and postgres found on
// PATH, in /usr/lib/postgresql/*/bin, Homebrew or Postgres.app, or in the
// directory PGLEADER_PG_BINDIR names), started in a temporary directory on a
// free loopback port, as the postgres OS user when the tests run as root.
// When none can start, the test fails with a message that says how to
// install one.
//
//	var shared pgleadertest.Shared
//
//	func TestMain(m *testing.M) { os.Exit(pgleadertest.Main(m, &shared)) }
//
//	func TestFailover(t *testing.T) {
//		srv := shared.Get(t)
//		// run electors against srv.DSN(), then:
//		srv.TerminateLeader(ctx, key)
//	}
package pgleadertest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/internal/harness/pgtemp"
	"github.com/pgleader/pgleader/leader"
)

// Server is a throwaway PostgreSQL server, or the server PGLEADERTEST_DSN
// names (External).
type Server struct {
	s   *pgtemp.Server
	dsn string // an external server's, when s is nil
}

// DSNEnv names the variable that points the tests at an existing server
// (a CI service container, a testcontainers instance) instead of a
// throwaway one: New, Start and Shared then use it. Its fault helpers work
// there as far as its role allows (TerminateLeader and TerminateBackend
// need pg_signal_backend, a superuser, or the same role); Restart returns
// ErrExternal, for the test to skip.
const DSNEnv = "PGLEADERTEST_DSN"

// ErrExternal is returned by Restart on a server the tests did not start.
var ErrExternal = errors.New("pgleadertest: the server is " + DSNEnv + "'s, not a throwaway one")

// Mode is how Restart stops the server, as pg_ctl -m says it.
type Mode string

// Restart modes.
const (
	// Fast stops the server as pg_ctl -m fast does: sessions end, and with
	// them every advisory lock.
	Fast Mode = pgtemp.Fast
	// Immediate stops it as a crash would (pg_ctl -m immediate); the next
	// start runs crash recovery.
	Immediate Mode = pgtemp.Immediate
)

// ErrNoServer is wrapped by the error when no server could start.
var ErrNoServer = pgtemp.ErrNoServer

// Database returns the connection string of $DATABASE_URL when it is set,
// and otherwise starts a throwaway server (see New) and returns its: what a
// demo or an example runs against out of the box. stop releases it (it
// does nothing for $DATABASE_URL).
func Database() (dsn string, stop func(), err error) {
	if dsn := os.Getenv("DATABASE_URL"); dsn != "" {
		return dsn, func() {}, nil
	}
	fmt.Fprintln(os.Stderr, "DATABASE_URL is not set: starting a throwaway PostgreSQL ...")
	srv, err := New()
	if err != nil {
		return "", nil, err
	}
	return srv.DSN(), srv.Close, nil
}

// New starts a server that the caller stops with Close; Start is the same
// for a test. With PGLEADERTEST_DSN set it uses that server instead (it
// checks that it answers).
func New() (*Server, error) {
	if dsn := os.Getenv(DSNEnv); dsn != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := leader.DSN(dsn).Connect(ctx) // its errors never show the password
		if err != nil {
			return nil, fmt.Errorf("pgleadertest: %s: %w", DSNEnv, err)
		}
		conn.Close(ctx)
		return &Server{dsn: dsn}, nil
	}
	s, err := pgtemp.New(pgtemp.Options{})
	if err != nil {
		return nil, err
	}
	return &Server{s: s}, nil
}

// Start starts a server for t and stops it (and removes its files) at t's
// cleanup. It fails t, saying how to fix it, when no server can start.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := New()
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// External reports whether the server is PGLEADERTEST_DSN's.
func (s *Server) External() bool { return s.s == nil }

// DSN is a connection string for the server's superuser, postgres, in
// database postgres (an external server: PGLEADERTEST_DSN).
func (s *Server) DSN() string {
	if s.s == nil {
		return s.dsn
	}
	return s.s.DSN()
}

// Addr is the server's "host:port".
func (s *Server) Addr() string {
	if s.s != nil {
		return s.s.Addr()
	}
	cfg, err := pgx.ParseConfig(s.dsn)
	if err != nil {
		return ""
	}
	return net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
}

// Connect opens a connection as the server's superuser (an external
// server: as PGLEADERTEST_DSN's role).
func (s *Server) Connect(ctx context.Context) (*pgx.Conn, error) {
	if s.s == nil {
		return pgx.Connect(ctx, s.dsn)
	}
	return s.s.Connect(ctx)
}

// TerminateBackend ends, with pg_terminate_backend, every session of the
// candidate identity (its application_name is identity, or identity and a
// ranked candidate's rank, see leader.Rank), and reports how many it
// ended. Their advisory locks are freed at once.
func (s *Server) TerminateBackend(ctx context.Context, identity string) (int, error) {
	if s.s != nil {
		return s.s.TerminateBackend(ctx, identity)
	}
	conn, err := s.Connect(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT pid, COALESCE(application_name, '') FROM pg_catalog.pg_stat_activity
WHERE pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()`)
	if err != nil {
		return 0, err
	}
	var pids []int32
	for rows.Next() {
		var pid int32
		var app string
		if err := rows.Scan(&pid, &app); err != nil {
			rows.Close()
			return 0, err
		}
		if id, _, _ := leader.ParseApplicationName(app); id == identity {
			pids = append(pids, pid)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	var n int
	err = conn.QueryRow(ctx, `SELECT pg_catalog.count(*) FILTER (WHERE pg_catalog.pg_terminate_backend(p)) FROM pg_catalog.unnest($1::pg_catalog.int4[]) p`, pids).Scan(&n)
	return n, err
}

// TerminateLeader ends the session that holds key and returns its
// identity (application_name); "" and no error when nobody holds it.
func (s *Server) TerminateLeader(ctx context.Context, key leader.Key) (string, error) {
	conn, err := s.Connect(ctx)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background())
	h, err := leader.Holder(ctx, conn, key)
	if err != nil || !h.Held {
		return "", err
	}
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_terminate_backend($1)", int32(h.Holder.PID)).Scan(&ok); err != nil {
		return "", err
	}
	if !ok {
		return "", fmt.Errorf("pgleadertest: could not terminate backend %d", h.Holder.PID)
	}
	return h.Holder.Identity, nil
}

// Restart stops the server in mode (Fast or Immediate) and starts it again
// on the same port; every session ends. It returns once the server accepts
// connections again, or with ctx's error (the server may then still be
// starting).
func (s *Server) Restart(ctx context.Context, mode Mode) error {
	if s.s == nil {
		return fmt.Errorf("%w: Restart needs a throwaway server (skip the test when errors.Is(err, pgleadertest.ErrExternal))", ErrExternal)
	}
	if mode != Fast && mode != Immediate {
		return fmt.Errorf("pgleadertest: restart mode %q: want Fast or Immediate", mode)
	}
	done := make(chan error, 1)
	go func() { done <- s.s.Restart(string(mode)) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops the server and removes its files; it does nothing to an
// external server.
func (s *Server) Close() {
	if s.s != nil {
		s.s.Close()
	}
}

// Shared is one server for a whole test package, started on first use and
// stopped by Main. Tests that share it should use keys of their own.
type Shared struct {
	once sync.Once
	srv  *Server
	err  error
}

// Get returns the shared server, starting it on first use; it fails t
// (saying how to fix it) when no server can start.
func (s *Shared) Get(t testing.TB) *Server {
	t.Helper()
	s.once.Do(func() { s.srv, s.err = New() })
	if s.err != nil {
		t.Fatalf("%v", s.err)
	}
	return s.srv
}

// Main runs the package's tests, then stops the shared servers; it returns
// the exit code for os.Exit.
func Main(m *testing.M, shared ...*Shared) int {
	code := m.Run()
	for _, s := range shared {
		if s.srv != nil {
			s.srv.Close()
		}
	}
	return code
}
