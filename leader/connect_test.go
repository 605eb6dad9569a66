package leader_test

import (
	"context"
	"strings"
	"testing"

	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/leader"
)

// showTransactionTimeout connects through c and reads transaction_timeout
// before the session sets anything.
func showTransactionTimeout(t *testing.T, c leader.Connector) string {
	t.Helper()
	ctx := context.Background()
	conn, err := c.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var v string
	if err := conn.QueryRow(ctx, "SHOW transaction_timeout").Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// connectTimes connects through c n times, closing each connection.
func connectTimes(t *testing.T, c leader.Connector, n int) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		conn, err := c.Connect(ctx)
		if err != nil {
			t.Fatalf("connection %d of %d: %v", i+1, n, err)
		}
		conn.Close(ctx)
	}
}

// On PostgreSQL 17 and later, a DSN Connector's connections after the
// first turn transaction_timeout off in the startup packet, which wins
// over the role's setting before any transaction runs: a reconnect on a
// starved server is not ended by its own first transaction. The first
// connection, which learns the server's version, has the role's setting
// until the session turns it off.
func TestDSNReconnectsWithoutTransactionTimeout(t *testing.T) {
	srv := server(t)
	if num := srv.VersionNum(); num < 170000 {
		t.Skipf("PostgreSQL %d has no transaction_timeout", num/10000)
	}
	r := testpg.NewRoles(t, srv)
	if err := srv.Exec(context.Background(), "ALTER ROLE "+r.App+" SET transaction_timeout = '1h'"); err != nil {
		t.Fatal(err)
	}
	c := leader.DSN(r.AppDSN)
	if v := showTransactionTimeout(t, c); v != "1h" {
		t.Fatalf("the first connection's transaction_timeout: %q; want the role's 1h", v)
	}
	for i := range 2 {
		if v := showTransactionTimeout(t, c); v != "0" {
			t.Fatalf("connection %d after the first: transaction_timeout %q; want 0 from the startup packet", i+1, v)
		}
	}
}

// A server that does not know transaction_timeout (before PostgreSQL 17:
// a failover to an older major) refuses it in the startup packet with a
// FATAL it logs; the Connector asks again without it, at once, and no
// more after that.
func TestDSNAsksAgainWithoutTransactionTimeout(t *testing.T) {
	srv := server(t)
	if num := srv.VersionNum(); num >= 170000 {
		t.Skipf("PostgreSQL %d knows transaction_timeout", num/10000)
	}
	c := leader.DSN(srv.DSN())
	leader.Untime(c)
	refusals := func() int {
		return strings.Count(srv.LogTail(1<<20), `unrecognized configuration parameter "transaction_timeout"`)
	}
	before := refusals()
	connectTimes(t, c, 3)
	if n := refusals() - before; n != 1 {
		t.Fatalf("the server refused transaction_timeout %d times in three connections; want once", n)
	}
}

// PgBouncer (session pooling, which pgleader supports) refuses a startup
// parameter it does not pass on, whatever the server's version: with
// PostgreSQL 17 or later behind it, every connection after the first
// would fail. The Connector asks again at once without the parameter, and
// never sends it again: one refusal in PgBouncer's log at most, however
// many connections, and none while the server behind it is older than 17
// (it never learns to send it).
func TestDSNThroughPgBouncer(t *testing.T) {
	for _, forced := range []bool{false, true} {
		t.Run(map[bool]string{false: "learned", true: "forced"}[forced], func(t *testing.T) {
			srv := server(t)
			bouncer := testpg.StartPgBouncer(t, srv, "session", 4)
			c := leader.DSN(bouncer.DSN())
			want := 0
			if forced || srv.VersionNum() >= 170000 {
				want = 1
			}
			if forced {
				leader.Untime(c)
			}
			connectTimes(t, c, 4)
			if n := strings.Count(bouncer.Log(), "closing because: unsupported startup parameter: transaction_timeout"); n != want {
				t.Fatalf("PgBouncer refused transaction_timeout %d times in four connections; want %d\n%s", n, want, bouncer.Log())
			}
		})
	}
}
