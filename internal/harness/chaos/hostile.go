package chaos

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgleader/pgleader/inspect"
	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/leader"
)

// The hostile tenant (Config.Hostile). The electors run as an ordinary
// role whose search_path puts public before pg_catalog, where another
// role, the tenant, has shadowed the advisory-lock functions and pg_locks
// (testpg.Roles.Shadow). Beside the schedule's faults, the tenant keeps
// doing, at random, what any role may:
//
//   - bursts of forged notifications on every channel pgleader uses:
//     announcements of a leader named EVIL and vacancies, resign requests
//     (which its role may not make) and requests naming candidates,
//     reservations, and for a group forged resigns of its keys (in this
//     version's encoding and the one before), joins, releases, "gone" for
//     live members, and junk;
//   - squats in pgleader's lock space: a key's gate and heir slots, a
//     group's roster lock in share mode (a member of another role) and the
//     member lock of the next member to start;
//   - fills the server's lock table until the server refuses, for a moment.
//
// None of it may break an invariant; the children also report every
// leader they are told of, and the checker requires each to be an elector.

// hostileSetup makes the roles, shadows the built-ins, and lets the
// electors' role use the harness's tables.
func (h *harness) hostileSetup() {
	r := testpg.NewRoles(h.t, h.primary)
	r.Shadow(h.t)
	ctx := context.Background()
	for _, q := range []string{
		"GRANT ALL ON chaos_writes, chaos_group_writes, pgleader_terms TO " + r.App,
		"GRANT ALL ON SEQUENCE chaos_writes_id_seq, chaos_group_writes_id_seq TO " + r.App,
		"GRANT CREATE ON SCHEMA public TO " + r.App,
	} {
		if err := h.primary.Exec(ctx, q); err != nil {
			h.t.Fatal(err)
		}
	}
	h.roles = r
	h.report.Hostile = map[string]int{}
}

// tenant runs the hostile tenant until stop closes.
func (h *harness) tenant(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	rng := rand.New(rand.NewSource(h.cfg.Seed + 1))
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(200+rng.Intn(600)) * time.Millisecond):
		}
		if conn == nil || conn.IsClosed() {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			var err error
			conn, err = pgx.Connect(ctx, testpg.RoleDSN(h.server(), h.roles.Evil)+"&application_name=tenant")
			cancel()
			if err != nil {
				h.count("connect failed: "+errKind(err), 1)
				conn = nil
				continue
			}
		}
		var err error
		op := "burst"
		switch n := rng.Intn(10); {
		case n < 6:
			err = h.burst(conn, rng)
		case n < 9:
			op = "squat"
			err = h.squat(conn, rng, stop)
		default:
			op = "fill"
			err = h.fill(conn, rng)
		}
		if err != nil {
			// Counted by kind, so that a run in which the tenant did
			// little says why.
			h.count(op+" failed: "+errKind(err), 1)
			conn.Close(context.Background()) // a restart or a failover: connect again
		}
	}
}

// errKind names an error for the report: its SQLSTATE, or a timeout, or
// its first words.
func errKind(err error) string {
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr):
		return pgErr.Code
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	}
	msg := err.Error()
	if len(msg) > 40 {
		msg = msg[:40]
	}
	return msg
}

// server is the server the schedule currently runs on.
func (h *harness) server() *testpg.Server {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.current
}

func (h *harness) count(what string, n int) {
	h.mu.Lock()
	h.report.Hostile[what] += n
	h.mu.Unlock()
}

// candidates are the identities of the processes started so far.
func (h *harness) candidates() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var ids []string
	for i := 1; i <= h.seq; i++ {
		ids = append(ids, fmt.Sprintf("chaos-%d", i))
	}
	return ids
}

// burst sends 50 to 200 forged notifications.
func (h *harness) burst(conn *pgx.Conn, rng *rand.Rand) error {
	ids := h.candidates()
	pick := func() string { return ids[rng.Intn(len(ids))] }
	n := 50 + rng.Intn(151)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var pid int32
	if !h.cfg.Group {
		c, o, s := leader.KeyFromName(h.key).LockTag()
		err := conn.QueryRow(ctx, `SELECT pid FROM pg_catalog.pg_locks WHERE locktype OPERATOR(pg_catalog.=) 'advisory'
			AND classid OPERATOR(pg_catalog.=) $1 AND objid OPERATOR(pg_catalog.=) $2 AND objsubid OPERATOR(pg_catalog.=) $3
			AND granted AND mode OPERATOR(pg_catalog.=) 'ExclusiveLock'`, c, o, s).Scan(&pid)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
	}
	b := &pgx.Batch{}
	for range n {
		ch, payload := h.forged(rng, pick, uint32(pid))
		b.Queue("SELECT pg_catalog.pg_notify($1, $2)", ch, payload)
	}
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	h.count("notifications", n)
	return nil
}

// forged is one forged notification; resign requests are addressed to
// leaderPID, the holder's backend pid as any role reads it in pg_locks.
func (h *harness) forged(rng *rand.Rand, pick func() string, leaderPID uint32) (channel, payload string) {
	if !h.cfg.Group {
		c, o, s := leader.KeyFromName(h.key).LockTag()
		tag := fmt.Sprintf("%d.%d.%d", c, o, s)
		switch rng.Intn(5) {
		case 0:
			return "pgleader." + tag, "EVIL"
		case 1:
			return "pgleader." + tag, ""
		case 2:
			return "pgleader.resign." + tag, lockconn.RequestPayload(leaderPID, "")
		case 3:
			return "pgleader.resign." + tag, lockconn.RequestPayload(leaderPID, pick())
		default:
			return "pgleader.reserve." + tag, pick()
		}
	}
	_, roster := inspect.GroupRoster(h.key)
	channel = fmt.Sprintf("pgleader.group.%d", roster)
	if rng.Intn(2) == 0 {
		channel += "." + strconv.FormatUint(uint64(uint32(memberLockOf(h.key, pick()))), 10)
	}
	c, o, s := leader.KeyFromName(groupKeyName(h.key, rng.Intn(h.cfg.Keys))).LockTag()
	tag := fmt.Sprintf("%d.%d.%d", c, o, s)
	switch rng.Intn(6) {
	case 0:
		return channel, fmt.Sprintf("resigned %q %s %q", pick(), tag, pick())
	case 1:
		return channel, pick() + " resigned " + tag + " to " + pick()
	case 2:
		return channel, "joined"
	case 3:
		return channel, "released"
	case 4:
		return channel, fmt.Sprintf("gone %q", pick())
	default:
		return channel, "junk " + strconv.Itoa(rng.Int())
	}
}

// memberLockOf is the second half of a group member's lock (as any role
// can compute it).
func memberLockOf(group, identity string) int32 {
	f := fnv.New32a()
	fmt.Fprintf(f, "member|%s|%s", group, identity)
	return int32(f.Sum32())
}

// squat holds locks of pgleader's space for 1 to 3 s.
func (h *harness) squat(conn *pgx.Conn, rng *rand.Rand, stop <-chan struct{}) error {
	const heirClass = 0x70674C48
	var objs []int32
	var shared []int32
	if h.cfg.Group {
		_, roster := inspect.GroupRoster(h.key)
		shared = append(shared, int32(roster))
		h.mu.Lock()
		next := fmt.Sprintf("chaos-%d", h.seq+1)
		h.mu.Unlock()
		objs = append(objs, memberLockOf(h.key, next))
	} else {
		c, o, s := leader.KeyFromName(h.key).LockTag()
		f := fnv.New32a()
		fmt.Fprintf(f, "%d.%d.%d", c, o, s)
		roster := int32(f.Sum32())
		objs = append(objs, roster-1, roster+1, roster+2) // the gate and both heir slots
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b := &pgx.Batch{}
	for _, o := range objs {
		b.Queue("SELECT pg_catalog.pg_try_advisory_lock($1::pg_catalog.int4, $2::pg_catalog.int4)", int32(heirClass), o)
	}
	for _, o := range shared {
		b.Queue("SELECT pg_catalog.pg_try_advisory_lock_shared($1::pg_catalog.int4, $2::pg_catalog.int4)", int32(heirClass), o)
	}
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	h.count("squats", 1)
	select {
	case <-stop:
	case <-time.After(time.Duration(1000+rng.Intn(2000)) * time.Millisecond):
	}
	_, err := conn.Exec(ctx, "SELECT pg_catalog.pg_advisory_unlock_all()")
	return err
}

// fill takes advisory locks until the server's lock table is full, holds
// them 300 to 800 ms, and lets them go.
func (h *harness) fill(conn *pgx.Conn, rng *rand.Rand) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	held := 0
	for i := int64(1 << 41); held < 1_000_000; i += 500 {
		_, err := conn.Exec(ctx, "SELECT pg_catalog.pg_advisory_lock(k) FROM pg_catalog.generate_series($1::pg_catalog.int8, $1::pg_catalog.int8 + 499) k", i)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "53200" {
			break
		}
		if err != nil {
			return err
		}
		held += 500
	}
	h.count("fills", 1)
	h.count("locks held by the filler", held)
	time.Sleep(time.Duration(300+rng.Intn(500)) * time.Millisecond)
	_, err := conn.Exec(ctx, "SELECT pg_catalog.pg_advisory_unlock_all()")
	return err
}
