package lockconn_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/leader"
)

// The keys of the member tests, one of each form: a bigint key (as
// pg_locks shows it: the high and the low half, objsubid 1) and a pair key
// (objsubid 2), outside pgleader's space.
var (
	memberHeld8  = lockconn.Tag3{C: 0x0001_2345, O: 0x6789_0001, S: 1}
	memberHeld2  = lockconn.Tag3{C: 0x0001_2345, O: 0x6789_0002, S: 2}
	memberWant8  = lockconn.Tag3{C: 0x0001_2345, O: 0x6789_0003, S: 1}
	memberWant2  = lockconn.Tag3{C: 0x0001_2345, O: 0x6789_0004, S: 2}
	memberAllTag = []lockconn.Tag3{memberHeld8, memberHeld2, memberWant8, memberWant2}
)

// lockSQL is the call that takes (or, with fn "pg_advisory_unlock",
// releases) k by hand.
func lockSQL(fn string, k lockconn.Tag3) (string, []any) {
	if k.S == 1 {
		return "SELECT " + fn + "($1::int8)", []any{int64(k.C)<<32 | int64(k.O)}
	}
	return "SELECT " + fn + "($1::int4, $2::int4)", []any{int32(k.C), int32(k.O)}
}

// heldBy reports whether backend pid holds k exclusively, as pg_locks
// shows it to admin (a session of the same server).
func heldBy(t *testing.T, admin *pgx.Conn, pid uint32, k lockconn.Tag3) bool {
	t.Helper()
	var n int
	err := admin.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1
		AND classid = $2::oid AND objid = $3::oid AND objsubid = $4 AND granted AND mode = 'ExclusiveLock'`,
		int32(pid), k.C, k.O, k.S).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// inSpace counts the locks backend pid holds, in any mode, in pgleader's
// own space (the member and roster locks).
func inSpace(t *testing.T, admin *pgx.Conn, pid uint32) int {
	t.Helper()
	var n int
	err := admin.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1
		AND classid = $2::oid AND granted`, int32(pid), uint32(lockconn.Space)).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// joinRefused checks that a member whose session is refused (want: the
// error) neither takes its member lock nor joins.
func joinRefused(t *testing.T, m *lockconn.Member, admin *pgx.Conn, pid uint32, want error) {
	t.Helper()
	if ok, _, err := m.TakeMemberLock(context.Background()); !errors.Is(err, want) || ok {
		t.Errorf("TakeMemberLock: %v, %v; want %v and nothing taken", ok, err, want)
	}
	if ok, err := m.Join(context.Background()); !errors.Is(err, want) || ok {
		t.Errorf("Join: %v, %v; want %v and nothing taken", ok, err, want)
	}
	if n := inSpace(t, admin, pid); n != 0 {
		t.Errorf("%d locks taken in pgleader's space by a member lock or join that was refused", n)
	}
}

// exchangeBoth runs a light round's exchange (the check in the same round
// trip) that releases the two held keys and tries the two wanted ones.
func exchangeBoth(m *lockconn.Member) (won []lockconn.Tag3, unlocked bool, err error) {
	return m.Exchange(context.Background(), lockconn.Exchange{Check: true,
		Unlock: []lockconn.Tag3{memberHeld8, memberHeld2}, Want: []lockconn.Tag3{memberWant8, memberWant2},
		Marker: lockconn.GroupMarker("member-guards", 4)})
}

// A light round sends its exchange in the same round trip as the check
// that proves the session, so the server runs the unlocks and the tries
// before the client reads the check's answer: each statement must itself
// do nothing on a backend other than the session's own (a transaction
// pooler's, or its pid reused), on one where another client's state
// replaced the token (DISCARD ALL), and on a standby. Otherwise a member
// whose backend changed hands would take keys on a backend nobody renews
// (held there, unled, until it ends) or release another client's locks.
// Each statement is checked for both key forms; a right session is the
// control: the same exchange releases and wins every key. The member lock
// and the join guard themselves the same way (a round that has not joined
// yet joins before its check), and so does leaving, whose unlock-all would
// free another client's locks.
func TestMemberExchangeGuards(t *testing.T) {
	ctx := context.Background()
	admin := plainConn(t)
	conn, sess := session(t, "member-guards", time.Second)
	hold := func(t *testing.T) {
		t.Helper()
		for _, k := range []lockconn.Tag3{memberHeld8, memberHeld2} {
			if !heldBy(t, admin, sess.PID, k) {
				q, args := lockSQL("pg_advisory_lock", k)
				if _, err := conn.Exec(ctx, q, args...); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for _, c := range []struct {
		name string
		sess lockconn.Session
	}{
		{"another backend's pid", lockconn.Session{PID: sess.PID + 1, Token: sess.Token}},
		{"another client's token", lockconn.Session{PID: sess.PID, Token: sess.Token + "0"}},
		{"no token", lockconn.Session{PID: sess.PID}},
	} {
		t.Run(c.name, func(t *testing.T) {
			hold(t)
			m := lockconn.NewMember(conn, c.sess, "member-guards", "m")
			won, unlocked, err := exchangeBoth(m)
			if !errors.Is(err, lockconn.ErrTransactionPooling) || len(won) > 0 || unlocked {
				t.Fatalf("exchange: won %v, unlocked %v, %v; want ErrTransactionPooling and nothing done", won, unlocked, err)
			}
			for _, k := range []lockconn.Tag3{memberHeld8, memberHeld2} {
				if !heldBy(t, admin, sess.PID, k) {
					t.Errorf("%v was released by an exchange whose session is not this backend's", k)
				}
			}
			for _, k := range []lockconn.Tag3{memberWant8, memberWant2} {
				if heldBy(t, admin, sess.PID, k) {
					t.Errorf("%v was taken by an exchange whose session is not this backend's", k)
				}
			}
			joinRefused(t, m, admin, sess.PID, lockconn.ErrTransactionPooling)
			// Leaving frees every lock of the backend: none of another
			// client's.
			if err := m.Leave(ctx); !errors.Is(err, lockconn.ErrTransactionPooling) {
				t.Errorf("Leave: %v, want ErrTransactionPooling", err)
			}
			for _, k := range []lockconn.Tag3{memberHeld8, memberHeld2} {
				if !heldBy(t, admin, sess.PID, k) {
					t.Errorf("%v was released by a Leave whose session is not this backend's", k)
				}
			}
		})
	}
	t.Run("the session's own", func(t *testing.T) {
		hold(t)
		m := lockconn.NewMember(conn, sess, "member-guards", "m")
		won, unlocked, err := exchangeBoth(m)
		if err != nil || !unlocked || len(won) != 2 {
			t.Fatalf("exchange: won %v, unlocked %v, %v; want both released and both won", won, unlocked, err)
		}
		for _, k := range memberAllTag {
			want := k == memberWant8 || k == memberWant2
			if got := heldBy(t, admin, sess.PID, k); got != want {
				t.Errorf("%v held %v after the exchange, want %v", k, got, want)
			}
		}
		if ok, _, err := m.TakeMemberLock(ctx); err != nil || !ok {
			t.Errorf("TakeMemberLock: %v, %v; want it taken", ok, err)
		}
		if ok, err := m.Join(ctx); err != nil || !ok {
			t.Errorf("Join: %v, %v; want joined", ok, err)
		}
		if n := inSpace(t, admin, sess.PID); n != 2 {
			t.Errorf("%d locks in pgleader's space after the member lock and the join, want 2", n)
		}
		if err := m.Leave(ctx); err != nil {
			t.Errorf("Leave: %v", err)
		}
		for _, k := range memberAllTag {
			if heldBy(t, admin, sess.PID, k) {
				t.Errorf("%v still held after Leave", k)
			}
		}
		if n := inSpace(t, admin, sess.PID); n != 0 {
			t.Errorf("%d locks in pgleader's space after Leave, want 0", n)
		}
	})
}

// The same on a hot standby, where advisory locks work: a session there
// (with its own pid and token; the session's setup refuses a standby, so
// the test sets its token by hand) must neither release nor take a key,
// nor take its member lock or join.
func TestMemberExchangeRefusesAStandby(t *testing.T) {
	ctx := context.Background()
	_, standby := testpg.StartWithStandby(t)
	conn, err := leader.DSN(standby.DSN()).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	admin, err := standby.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var pid int32
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid(), set_config('pgleader.owner', 'standby-token', false)").Scan(&pid, new(string)); err != nil {
		t.Fatal(err)
	}
	for _, k := range []lockconn.Tag3{memberHeld8, memberHeld2} {
		q, args := lockSQL("pg_advisory_lock", k)
		if _, err := conn.Exec(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	}
	m := lockconn.NewMember(conn, lockconn.Session{PID: uint32(pid), Token: "standby-token"}, "member-guards", "m")
	won, unlocked, err := exchangeBoth(m)
	if !errors.Is(err, lockconn.ErrStandby) || len(won) > 0 || unlocked {
		t.Fatalf("exchange on a standby: won %v, unlocked %v, %v; want ErrStandby and nothing done", won, unlocked, err)
	}
	for _, k := range memberAllTag {
		want := k == memberHeld8 || k == memberHeld2
		if got := heldBy(t, admin, uint32(pid), k); got != want {
			t.Errorf("%v held %v on the standby after the exchange, want %v (held by hand before it)", k, got, want)
		}
	}
	joinRefused(t, m, admin, uint32(pid), lockconn.ErrStandby)
}

// activity is backend pid's pg_stat_activity row, as another session of
// the same role reads it: when its last statement began, when its state
// last changed, and the state.
func activity(t *testing.T, admin *pgx.Conn, pid uint32) (queryStart, stateChange time.Time, state string) {
	t.Helper()
	err := admin.QueryRow(context.Background(), `SELECT query_start, state_change, state FROM pg_stat_activity WHERE pid = $1`,
		int32(pid)).Scan(&queryStart, &stateChange, &state)
	if err != nil {
		t.Fatal(err)
	}
	return queryStart, stateChange, state
}

// A ping is a round trip to the session's own backend that runs no
// statement: the backend's last statement stays the last (query_start
// does not move) while each Sync reaches it (state_change moves), and a
// notification that arrives meanwhile is kept for the idle read. It is
// refused on a session that is not Direct, and reports the backend's end
// as ErrConnectionLost.
func TestMemberPing(t *testing.T) {
	ctx := context.Background()
	admin := plainConn(t)
	conn, sess := session(t, "member-ping", time.Second)
	if !sess.Direct {
		t.Fatal("a session on 127.0.0.1 with no proxy is not Direct")
	}
	m := lockconn.NewMember(conn, sess, "member-ping", "m")
	if !m.Direct() {
		t.Fatal("Member.Direct: false on a Direct session")
	}
	if err := m.Listen(ctx); err != nil {
		t.Fatal(err)
	}
	q0, s0, _ := activity(t, admin, sess.PID)
	for i := range 3 {
		if i == 1 {
			if _, err := admin.Exec(ctx, "SELECT pg_notify($1, 'during-ping')", lockconn.GroupChannel("member-ping")); err != nil {
				t.Fatal(err)
			}
		}
		if err := m.Ping(ctx); err != nil {
			t.Fatalf("ping %d: %v", i, err)
		}
	}
	q1, s1, state := activity(t, admin, sess.PID)
	if !q1.Equal(q0) {
		t.Errorf("the backend's last statement began at %s before the pings and at %s after: a ping ran a statement", q0, q1)
	}
	if !s1.After(s0) || state != "idle" {
		t.Errorf("state %q changed at %s before the pings and at %s after: no Sync reached the backend", state, s0, s1)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	n, err := m.Wait(wctx)
	cancel()
	if err != nil || n == nil || n.Payload != "during-ping" {
		t.Errorf("the notification sent between pings: %v, %v", n, err)
	}
	// A session left inside a transaction (a bug of ours: only the
	// member sends on its connection) answers a Sync in state 'T': no
	// proof that the round's statements ran to their end.
	if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if err := m.Ping(ctx); !errors.Is(err, lockconn.ErrConnectionLost) || !strings.Contains(err.Error(), "transaction state") {
		t.Errorf("ping inside a transaction: %v, want ErrConnectionLost (not idle)", err)
	}
	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	if err := m.Ping(ctx); err != nil {
		t.Errorf("ping after the rollback: %v", err)
	}
	notDirect := sess
	notDirect.Direct = false
	if err := lockconn.NewMember(conn, notDirect, "member-ping", "m").Ping(ctx); !errors.Is(err, lockconn.ErrNotDirect) {
		t.Errorf("ping on a session that is not Direct: %v, want ErrNotDirect", err)
	}
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend($1)", int32(sess.PID)); err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := m.Ping(pctx); !errors.Is(err, lockconn.ErrConnectionLost) {
		t.Errorf("ping after the backend was terminated: %v, want ErrConnectionLost", err)
	}
}
