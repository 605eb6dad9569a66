package elector_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/internal/testpg"
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
