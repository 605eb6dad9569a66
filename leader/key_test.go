package leader_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/leader"
)

func TestKeyFromNameMatchesSQL(t *testing.T) {
	c := conn(t)
	for _, name := range []string{"billing-consumer", "x", "a much longer name with spaces / and slashes", "ünïcödé-名前", "0"} {
		var want int64
		if err := c.QueryRow(context.Background(), "SELECT "+leader.KeyFromNameSQL, name).Scan(&want); err != nil {
			t.Fatal(err)
		}
		got, ok := leader.KeyFromName(name).Int64()
		if !ok || got != want {
			t.Errorf("KeyFromName(%q) = %d, SQL gives %d", name, got, want)
		}
	}
}

func TestKeyFromNameIsStable(t *testing.T) {
	// Pinned values: a change here would split every deployed fleet.
	for name, want := range map[string]int64{
		"billing-consumer": 6869070981396482805,
		"x":                3274422879871479876,
	} {
		if got, _ := leader.KeyFromName(name).Int64(); got != want {
			t.Errorf("KeyFromName(%q) = %d, want %d", name, got, want)
		}
	}
}

// LockTag matches what pg_locks shows for locks taken with the SQL
// functions, in both key spaces, including negative values.
func TestLockTagMatchesPgLocks(t *testing.T) {
	c := conn(t)
	ctx := context.Background()
	keys := []leader.Key{
		leader.Int64Key(42), leader.Int64Key(-1), leader.Int64Key(-9223372036854775808), leader.Int64Key(1 << 40),
		leader.PairKey(7, 42), leader.PairKey(-3, -2147483648), leader.KeyFromName("billing-consumer"),
	}
	for _, k := range keys {
		args, vals := k.SQLArgs(1)
		if _, err := c.Exec(ctx, "SELECT pg_advisory_lock("+args+")", vals...); err != nil {
			t.Fatal(err)
		}
		var classid, objid uint32
		var objsubid int16
		err := c.QueryRow(ctx, `SELECT classid, objid, objsubid FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()`).Scan(&classid, &objid, &objsubid)
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		wc, wo, ws := k.LockTag()
		if classid != wc || objid != wo || objsubid != ws {
			t.Errorf("%s: pg_locks (%d,%d,%d), LockTag (%d,%d,%d)", k, classid, objid, objsubid, wc, wo, ws)
		}
		if back := leader.KeyFromLockTag(classid, objid, objsubid); back.String() != leader.KeyFromLockTag(wc, wo, ws).String() {
			t.Errorf("%s: KeyFromLockTag gives %s", k, back)
		}
		if _, err := c.Exec(ctx, "SELECT pg_advisory_unlock("+args+")", vals...); err != nil {
			t.Fatal(err)
		}
	}
}

func TestKeyBasics(t *testing.T) {
	if (leader.Key{}).Valid() || leader.KeyFromName("").Valid() || leader.KeyFromName("\xff").Valid() {
		t.Fatal("invalid keys reported valid")
	}
	if v, ok := leader.Int64Key(-5).Int64(); !ok || v != -5 {
		t.Fatalf("Int64Key round trip: %d %v", v, ok)
	}
	if a, b, ok := leader.PairKey(-5, 9).Pair(); !ok || a != -5 || b != 9 {
		t.Fatalf("PairKey round trip: %d %d %v", a, b, ok)
	}
	if leader.PairKey(0, 1) == leader.Int64Key(1) {
		t.Fatal("pair and bigint key spaces collide")
	}
	for k, want := range map[leader.Key]string{leader.Int64Key(-5): "-5", leader.PairKey(7, 42): "7:42"} {
		if k.String() != want {
			t.Errorf("String() = %q, want %q", k.String(), want)
		}
	}
}

func TestHolderFindsHolderAndWaiters(t *testing.T) {
	ctx := context.Background()
	key := leader.KeyFromName(t.Name())
	args, vals := key.SQLArgs(1)
	connAs := func(app string) *pgx.Conn { return testpg.ConnectAs(t, server(t).DSN(), app) }
	h, err := leader.Holder(ctx, conn(t), key)
	if err != nil || h.Held || len(h.Waiters) != 0 {
		t.Fatalf("free key: %+v, %v", h, err)
	}
	holder := connAs("the-holder")
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_lock("+args+")", vals...); err != nil {
		t.Fatal(err)
	}
	waiter := connAs("the-waiter [N2 1.8.0]") // a ranked candidate
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		waiter.Exec(wctx, "SELECT pg_advisory_lock("+args+")", vals...)
	}()
	// An unprivileged role sees the same.
	if err := server(t).Exec(ctx, "DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'plain') THEN CREATE ROLE plain LOGIN; END IF; END$$"); err != nil {
		t.Fatal(err)
	}
	cfg, _ := pgx.ParseConfig(server(t).DSN())
	cfg.User = "plain"
	plain, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close(ctx)
	for {
		h, err = leader.Holder(ctx, plain, key)
		if err != nil {
			t.Fatal(err)
		}
		if len(h.Waiters) == 1 {
			break
		}
	}
	if !h.Held || h.Identity() != "the-holder" || h.Holder.User != "postgres" || h.Waiters[0].Identity != "the-waiter" || h.Holder.PID == 0 {
		t.Fatalf("Holder: %+v", h)
	}
	want := leader.Rank{Strategy: leader.NewestVersion, Preference: leader.Preference{Priority: 2, Version: "1.8.0"}}
	if h.Holder.Rank != nil || h.Waiters[0].Rank == nil || *h.Waiters[0].Rank != want {
		t.Fatalf("ranks: the holder's %+v (want none), the waiter's %+v (want %+v)", h.Holder.Rank, h.Waiters[0].Rank, want)
	}
	cancel()
	<-done
}

// A session that holds a key in share mode holds no leadership: Holder
// names it among the Sharers (it blocks the election), never as the
// holder, whichever sorts first.
func TestHolderIsNeverASharer(t *testing.T) {
	ctx := context.Background()
	key := leader.KeyFromName(t.Name())
	args, vals := key.SQLArgs(1)
	var conns []*pgx.Conn
	for _, app := range []string{"sharer-1", "sharer-2"} {
		cfg, err := pgx.ParseConfig(server(t).DSN())
		if err != nil {
			t.Fatal(err)
		}
		cfg.RuntimeParams["application_name"] = app
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "SELECT pg_advisory_lock_shared("+args+")", vals...); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	h, err := leader.Holder(ctx, conns[0], key)
	if err != nil || h.Held || h.Identity() != "" || len(h.Sharers) != 2 || h.Sharers[0].Identity != "sharer-1" {
		t.Fatalf("key held shared by two sessions: %+v, %v; want no holder and two sharers", h, err)
	}
}

func BenchmarkKeyFromName(b *testing.B) {
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		leader.KeyFromName("billing-consumer")
	}
}

// A failed connection's message names the reason first: the line of a TLS
// attempt the server refused (sslmode=prefer) is dropped when pgx then
// tried the same host without TLS. The error stays in the chain.
func TestConnectErrorLeadsWithTheReason(t *testing.T) {
	srv := shared.Get(t)
	ctx := context.Background()
	for _, q := range []string{"CREATE ROLE " + testpg.PasswordRole + " NOLOGIN", "CREATE ROLE tidy_user LOGIN PASSWORD 'right' IN ROLE " + testpg.PasswordRole} {
		srv.Exec(ctx, q)
	}
	// No sslmode: prefer, the default, tries TLS first.
	_, err := leader.DSN("postgres://tidy_user:wrong@" + srv.Addr() + "/postgres?connect_timeout=10").Connect(ctx)
	var pgErr *pgconn.PgError
	if !errors.Is(err, leader.ErrRejected) || !errors.As(err, &pgErr) || pgErr.Code != "28P01" {
		t.Fatalf("want ErrRejected with the server's 28P01, got %v", err)
	}
	t.Log(err)
	if strings.Contains(err.Error(), "tls error") || !strings.Contains(err.Error(), "password authentication failed") || strings.Contains(err.Error(), "wrong") {
		t.Fatalf("message: %q", err.Error())
	}
}
