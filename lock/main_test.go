package lock_test

import (
	"os"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/internal/testpg"
)

var shared testpg.Shared

func server(t testing.TB) *testpg.Server { return shared.Get(t) }

func conn(t testing.TB) *pgx.Conn { return shared.Conn(t) }

func TestMain(m *testing.M) { os.Exit(testpg.Main(m, childMain, &shared)) }
