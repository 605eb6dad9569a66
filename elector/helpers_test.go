package elector_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/leader"
)

func mustConn(t testing.TB, srv *testpg.Server) *pgx.Conn {
	t.Helper()
	conn, err := srv.Connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// waitWaiter waits until the elector named id queues on key.
func waitWaiter(t testing.TB, srv *testpg.Server, key leader.Key, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	if err := testpg.WaitWaiter(ctx, mustConn(t, srv), key, id); err != nil {
		t.Fatal(err)
	}
}
