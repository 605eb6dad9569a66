package testpg

import (
	"errors"
	"os"
	"testing"

	"github.com/pgleader/pgleader/internal/harness/pgtemp"
)

// PgBouncer is a throwaway PgBouncer; see pgtemp.PgBouncer.
type PgBouncer = pgtemp.PgBouncer

// SkipPgBouncerEnv names the variable that skips the PgBouncer tests when
// PgBouncer is not installed.
const SkipPgBouncerEnv = "PGLEADER_SKIP_PGBOUNCER"

// StartPgBouncer starts PgBouncer in front of s (see pgtemp.StartPgBouncer)
// and stops it at cleanup. When PgBouncer is not installed the test fails,
// saying how to install it: go test shows nothing of a passing package but
// "ok", so a skip would go unseen. Setting PGLEADER_SKIP_PGBOUNCER=1 skips
// instead, by choice.
func StartPgBouncer(t testing.TB, s *Server, mode string, poolSize int) *PgBouncer {
	t.Helper()
	b, err := pgtemp.StartPgBouncer(s, mode, poolSize)
	switch {
	case errors.Is(err, pgtemp.ErrNoPgBouncer) && os.Getenv(SkipPgBouncerEnv) != "":
		t.Skipf("SKIPPED, NOT PASSED (%s is set): %v", SkipPgBouncerEnv, err)
	case errors.Is(err, pgtemp.ErrNoPgBouncer):
		t.Fatalf("%v; or set %s=1 to skip the PgBouncer tests", err, SkipPgBouncerEnv)
	case err != nil:
		t.Fatalf("%v", err)
	}
	t.Cleanup(b.Close)
	return b
}
