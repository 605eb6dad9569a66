package testpg_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/pgleader/pgleader/internal/testpg"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestNoServerSaysHowToFix(t *testing.T) {
	t.Setenv(testpg.BinDirEnv, t.TempDir())
	_, err := testpg.New(testpg.Options{})
	if !errors.Is(err, testpg.ErrNoServer) || !strings.Contains(err.Error(), "apt-get install -y postgresql") {
		t.Fatalf("want ErrNoServer with a fix, got %v", err)
	}
}

func TestServerAndFaults(t *testing.T) {
	srv := testpg.Start(t)
	ctx := context.Background()
	if srv.VersionNum() < 100000 {
		t.Fatalf("version %d", srv.VersionNum())
	}
	proxy, err := testpg.NewProxy(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()

	conn, err := pgx.Connect(ctx, proxy.DSN()+"&application_name=victim")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := conn.Ping(ctx); err != nil {
		t.Fatal(err)
	}

	// Black-hole: a query hangs (until its deadline), the socket stays open.
	proxy.Blackhole()
	qctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = conn.Ping(qctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ping through a black hole: want a deadline error, got %v", err)
	}
	proxy.Heal()
	conn2, err := pgx.Connect(ctx, proxy.DSN())
	if err != nil {
		t.Fatalf("connect after heal: %v", err)
	}
	defer conn2.Close(ctx)

	// Cut: the client sees the connection end at once.
	proxy.Cut()
	if err := conn2.Ping(ctx); err == nil {
		t.Fatal("ping after cut succeeded")
	}

	// TerminateBackend finds sessions by identity: the application_name,
	// with or without a ranked candidate's rank, and nothing else.
	connAs := func(app string) *pgx.Conn { return testpg.ConnectAs(t, srv.DSN(), app) }
	victims := []*pgx.Conn{connAs("victim2"), connAs("victim2 [N1 2.0.0]")}
	bystanders := []*pgx.Conn{connAs("victim2 [x]"), connAs("victim20")}
	if n, err := srv.TerminateBackend(ctx, "victim2"); err != nil || n != 2 {
		t.Fatalf("terminate: %d, %v; want 2", n, err)
	}
	for _, v := range victims {
		if err := v.Ping(ctx); err == nil {
			t.Fatal("ping after terminate succeeded")
		}
	}
	for _, b := range bystanders {
		if err := b.Ping(ctx); err != nil {
			t.Fatalf("a session of another name was terminated: %v", err)
		}
	}

	// Restart, both ways.
	for _, mode := range []string{testpg.Fast, testpg.Immediate} {
		if err := srv.Restart(mode); err != nil {
			t.Fatalf("%s restart: %v", mode, err)
		}
		if _, err := srv.QueryInt(ctx, "SELECT 1"); err != nil {
			t.Fatalf("after %s restart: %v", mode, err)
		}
	}
}

// The server the tests start is the one CI's matrix asks for: CI sets
// PGLEADER_EXPECT_MAJOR beside PGLEADER_PG_BINDIR and runs this test with
// -v, so that its output names the version each run used. A standby made
// without pg_basebackup (the matrix's builds lack it) replicates.
func TestServerVersion(t *testing.T) {
	primary, standby := testpg.StartWithStandby(t, testpg.Options{Settings: []string{"wal_level=replica", "max_wal_senders=4"}})
	ctx := context.Background()
	var version string
	conn, err := primary.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&version); err != nil {
		t.Fatal(err)
	}
	t.Logf("PostgreSQL %s (server_version_num %d), binaries from %s", version, primary.VersionNum(), primary.BinDir())
	if want := os.Getenv("PGLEADER_EXPECT_MAJOR"); want != "" && fmt.Sprint(primary.VersionNum()/10000) != want {
		t.Fatalf("server_version_num %d, want major %s", primary.VersionNum(), want)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS replicated (v int); INSERT INTO replicated VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, err := standby.QueryInt(ctx, "SELECT count(*) FROM replicated")
		if err == nil && n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the standby did not replicate within 30s (%v)", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
