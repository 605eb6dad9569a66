package testpg

import (
	"errors"
	"os"
	"testing"

	"github.com/pgleader/pgleader/internal/pgtemp"
)

// PgBouncer is a throwaway PgBouncer; see pgtemp.PgBouncer.
type PgBouncer = pgtemp.PgBouncer

// StartPgBouncer starts PgBouncer in front of s (see pgtemp.StartPgBouncer)
// and stops it at cleanup. When PgBouncer is not installed the test is
// skipped with a loud message naming the package to install, except under
// CI (the CI environment variable set), where it fails: CI must run it.
func StartPgBouncer(t testing.TB, s *Server, mode string, poolSize int) *PgBouncer {
	t.Helper()
	b, err := pgtemp.StartPgBouncer(s, mode, poolSize)
	switch {
	case errors.Is(err, pgtemp.ErrNoPgBouncer) && os.Getenv("CI") == "":
		t.Skipf("SKIPPED, NOT PASSED: %v", err)
	case err != nil:
		t.Fatalf("%v", err)
	}
	t.Cleanup(b.Close)
	return b
}
