package testpg

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
)

// ConnectSendingCancels returns a connect function for dsn whose
// connections, when a statement's context ends, send the server a cancel
// request (pgconn's CancelRequestContextWatcherHandler) instead of
// closing the socket, and close it only 5 s later. A cancel request ends
// a commit's wait for a synchronous standby with the transaction
// committed on the primary only, and the server answers success.
func ConnectSendingCancels(dsn string) func(ctx context.Context) (*pgx.Conn, error) {
	return func(ctx context.Context) (*pgx.Conn, error) {
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			return nil, err
		}
		cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: 5 * time.Second}
		}
		return pgx.ConnectConfig(ctx, cfg)
	}
}
