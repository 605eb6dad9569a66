package lock_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/internal/testpg"
)

var shared testpg.Shared

func server(t testing.TB) *testpg.Server { return shared.Get(t) }

func conn(t testing.TB) *pgx.Conn {
	t.Helper()
	c, err := server(t).Connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func TestMain(m *testing.M) { os.Exit(testpg.Main(m, childMain, &shared)) }
