package testpg_test

import (
	"context"
	"errors"
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

	// TerminateBackend finds sessions by application_name.
	victim, err := pgx.Connect(ctx, srv.DSN()+"&application_name=victim2")
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close(ctx)
	if n, err := srv.TerminateBackend(ctx, "victim2"); err != nil || n != 1 {
		t.Fatalf("terminate: %d, %v", n, err)
	}
	if err := victim.Ping(ctx); err == nil {
		t.Fatal("ping after terminate succeeded")
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
