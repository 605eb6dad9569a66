// Package testpg is the test layer over internal/harness/pgtemp: throwaway
// PostgreSQL servers that stop at a test's cleanup, one server shared by a
// package (Shared, Main, which also checks for leaked goroutines), PgBouncer,
// and child processes that report events (the event protocol is
// internal/fleet's).
package testpg

import (
	"testing"

	"github.com/pgleader/pgleader/internal/harness/pgtemp"
)

// The throwaway server and the fault proxy are pgtemp's.
type (
	// Server is a throwaway PostgreSQL cluster; see pgtemp.Server.
	Server = pgtemp.Server
	// Options tune a throwaway server; see pgtemp.Options.
	Options = pgtemp.Options
	// Proxy is the fault-injecting TCP proxy; see pgtemp.Proxy.
	Proxy = pgtemp.Proxy
)

// Re-exported from pgtemp.
const (
	Fast         = pgtemp.Fast
	Immediate    = pgtemp.Immediate
	PasswordRole = pgtemp.PasswordRole
	BinDirEnv    = pgtemp.BinDirEnv
	HowToFix     = pgtemp.HowToFix
)

// Re-exported from pgtemp.
var (
	New         = pgtemp.New
	NewProxy    = pgtemp.NewProxy
	DSNFor      = pgtemp.DSNFor
	ErrNoServer = pgtemp.ErrNoServer
)

// Start starts a throwaway server for a test and stops and removes it at
// cleanup. It fails the test, with a message saying how to fix it, when no
// server can be started.
func Start(t testing.TB, opts ...Options) *Server {
	t.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	s, err := New(o)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// StartWithStandby starts a throwaway primary and a streaming standby of
// it, both stopped at cleanup (the standby first).
func StartWithStandby(t testing.TB, opts ...Options) (primary, standby *Server) {
	t.Helper()
	primary = Start(t, opts...)
	standby, err := primary.NewStandby()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(standby.Close)
	return primary, standby
}
