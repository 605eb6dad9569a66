package testpg

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/pgleader/pgleader/leader"
)

// Shared is a test package's throwaway server, started on first use and
// stopped by Main. Tests that share it use their own keys.
type Shared struct {
	once sync.Once
	srv  *Server
	err  error
}

// Get returns the server, starting it on first use; it fails t (with a hint
// how to fix it) when no server can be started.
func (s *Shared) Get(t testing.TB) *Server {
	t.Helper()
	srv, err := s.Start()
	if err != nil {
		t.Fatalf("%v", err)
	}
	return srv
}

// Conn opens a connection to the shared server, closed at t's cleanup.
func (s *Shared) Conn(t testing.TB) *pgx.Conn {
	t.Helper()
	c, err := s.Get(t).Connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// DSN is the shared server's connection string, for Example functions
// (which have no testing.TB); it panics when no server can start.
func (s *Shared) DSN() string {
	srv, err := s.Start()
	if err != nil {
		panic(err)
	}
	return srv.DSN()
}

// Start is Get for code without a testing.TB (examples).
func (s *Shared) Start() (*Server, error) {
	s.once.Do(func() { s.srv, s.err = New(Options{}) })
	return s.srv, s.err
}

// Main runs a test package and returns its exit code: when the binary was
// started as a child (see StartChild) it runs child(role) and exits;
// otherwise it runs the tests, stops the shared servers, and fails on
// leaked goroutines (goleak).
//
//	func TestMain(m *testing.M) { os.Exit(testpg.Main(m, nil, &shared)) }
func Main(m *testing.M, child func(role string) int, shared ...*Shared) int {
	if role := os.Getenv(ChildEnv); role != "" && child != nil {
		os.Exit(child(role))
	}
	code := m.Run()
	for _, s := range shared {
		if s.srv != nil {
			s.srv.Close()
		}
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	return code
}

// DefaultParallel raises the number of tests marked t.Parallel that run at
// once to n, unless the command line sets -parallel (whose default is
// GOMAXPROCS). It is for a TestMain whose parallel tests mostly wait
// (for lock waits of several seconds) and seldom run: two at a time on
// a 2-core machine would leave the package's time the sum of their waits.
// Call it before Main.
func DefaultParallel(n int) {
	if !flag.Parsed() {
		flag.Parse()
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		if err := flag.Set("test.parallel", strconv.Itoa(n)); err != nil {
			panic(err)
		}
	}
}

// WaitWaiter waits up to a minute until a session named identity (any
// session when "") queues for key behind a holder.
func WaitWaiter(ctx context.Context, conn *pgx.Conn, key leader.Key, identity string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		h, err := leader.Holder(ctx, conn, key)
		if err != nil {
			return err
		}
		for _, w := range h.Waiters {
			if h.Held && (identity == "" || w.Identity == identity) {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nobody named %q queued for %s within a minute", identity, key)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
