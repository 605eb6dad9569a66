package lockconn

import "github.com/jackc/pgx/v5"

// UnsafeLease makes a Lease on conn without Open's setup (and its standby
// check), so that a test can prove each later layer on its own.
func UnsafeLease(conn *pgx.Conn) *Lease {
	return &Lease{conn: conn, sess: Session{PID: conn.PgConn().PID(), Major: ServerMajor(conn)}}
}
