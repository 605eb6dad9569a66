package elector_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/leader"
)

// valueLog records what ObserveValues reported.
type valueLog struct {
	mu   sync.Mutex
	seen []leader.Proclamation
	ch   chan struct{}
}

func newValueLog() *valueLog { return &valueLog{ch: make(chan struct{}, 1)} }

func (v *valueLog) add(p leader.Proclamation) {
	v.mu.Lock()
	v.seen = append(v.seen, p)
	v.mu.Unlock()
	select {
	case v.ch <- struct{}{}:
	default:
	}
}

// wait waits until the latest report is want (a nil want Value: nil).
func (v *valueLog) wait(t *testing.T, want leader.Proclamation) {
	t.Helper()
	deadline := time.After(waitLong)
	for {
		v.mu.Lock()
		var last leader.Proclamation
		ok := len(v.seen) > 0
		if ok {
			last = v.seen[len(v.seen)-1]
		}
		v.mu.Unlock()
		if ok && samePro(last, want) {
			return
		}
		select {
		case <-v.ch:
		case <-deadline:
			t.Fatalf("never reported %s; last %s (ok %v)", showPro(want), showPro(last), ok)
		}
	}
}

func samePro(a, b leader.Proclamation) bool {
	return a.Identity == b.Identity && string(a.Value) == string(b.Value) && (a.Value == nil) == (b.Value == nil)
}

func showPro(p leader.Proclamation) string {
	if p.Value == nil {
		return fmt.Sprintf("{%q, nil}", p.Identity)
	}
	return fmt.Sprintf("{%q, %q}", p.Identity, p.Value)
}

// A leader's value is paired with that leader only, across a handover:
// while the new leader's value is not written yet (a session holds its row
// locked), ObserveValues, HolderValue and the followers report the new
// leader with no value, never with the old leader's; then its own value;
// then what it proclaims (announced: ObserveValues polls only hourly
// here). Rows rewritten to name the holder's pid with
// another session start or another identity pair with nobody.
func TestValueAcrossHandover(t *testing.T) {
	// Only announcements may bring news: a new leader's value, and a
	// proclaimed one, must be announced.
	defer elector.SetObservePoll(elector.SetObservePoll(time.Hour))
	srv := sharedServer(t)
	key := testKey(t)
	const table = "values_handover"
	ctx, cancel := context.WithCancel(context.Background())
	obs := newValueLog()
	obsDone := make(chan error, 1)
	go func() {
		obsDone <- elector.ObserveValues(ctx, elector.DSN(srv.DSN()), key, elector.Values{Table: table}, obs.add)
	}()
	defer func() {
		cancel()
		if err := <-obsDone; !errors.Is(err, context.Canceled) {
			t.Errorf("ObserveValues returned %v, want context.Canceled", err)
		}
	}()
	obs.wait(t, leader.Proclamation{})
	rec := newRecorder(t)
	withValue := func(v string) func(*elector.Config) {
		return func(c *elector.Config) { c.Value, c.Values.Table = []byte(v), table }
	}
	a := startWith(t, rec, opts{dsn: srv.DSN(), key: key, id: "val-a"}, withValue("addr-a"))
	obs.wait(t, leader.Proclamation{Identity: "val-a", Value: []byte("addr-a")})
	bReports := newValueLog()
	b := startWith(t, rec, opts{dsn: srv.DSN(), key: key, id: "val-b"}, func(c *elector.Config) {
		withValue("addr-b")(c)
		c.Callbacks.OnLeaderValue = bReports.add
	})
	followerSees := func(r *running, want leader.Proclamation) {
		t.Helper()
		eventually(t, "a follower's LeaderValue", func() (bool, string) {
			got := r.e.LeaderValue()
			return samePro(got, want), showPro(got)
		})
	}
	followerSees(b, leader.Proclamation{Identity: "val-a", Value: []byte("addr-a")})
	admin := mustConn(t, srv)
	holderValue := func() leader.Proclamation {
		t.Helper()
		p, err := leader.HolderValue(ctx, admin, key, table, "")
		if err != nil {
			t.Fatalf("HolderValue: %v", err)
		}
		return p
	}
	c, o, s := key.LockTag()
	row := fmt.Sprintf("classid = %d AND objid = %d AND objsubid = %d", c, o, s)

	// The old leader's row stays locked: the new leader cannot write.
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT FROM "+table+" WHERE "+row+" FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	if err := a.e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	rec.next("elected", "val-b")
	obs.wait(t, leader.Proclamation{Identity: "val-b"})
	other := mustConn(t, srv)
	if p, err := leader.HolderValue(ctx, other, key, table, ""); err != nil || !samePro(p, leader.Proclamation{Identity: "val-b"}) {
		t.Fatalf("HolderValue while the new leader's value is unwritten: %s, %v; want {val-b, nil}", showPro(p), err)
	}
	if got := b.e.LeaderValue(); !samePro(got, leader.Proclamation{Identity: "val-b"}) {
		t.Fatalf("the new leader's LeaderValue before its value is written: %s", showPro(got))
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	obs.wait(t, leader.Proclamation{Identity: "val-b", Value: []byte("addr-b")})
	followerSees(a, leader.Proclamation{Identity: "val-b", Value: []byte("addr-b")})

	// Proclaim: a new value, no new election.
	if err := b.e.Proclaim(ctx, []byte("addr-b2")); err != nil {
		t.Fatalf("Proclaim: %v", err)
	}
	obs.wait(t, leader.Proclamation{Identity: "val-b", Value: []byte("addr-b2")})
	followerSees(a, leader.Proclamation{Identity: "val-b", Value: []byte("addr-b2")})
	if err := a.e.Proclaim(ctx, []byte("x")); !errors.Is(err, leader.ErrNotLeader) {
		t.Fatalf("a follower's Proclaim: %v, want ErrNotLeader", err)
	}

	// A row that names the holder's pid but another session start, or
	// another identity, is nobody's.
	for _, edit := range []string{"backend_start = backend_start - interval '1 second'", "holder = 'val-x'"} {
		if _, err := admin.Exec(ctx, "UPDATE "+table+" SET "+edit+" WHERE "+row); err != nil {
			t.Fatal(err)
		}
		if p := holderValue(); !samePro(p, leader.Proclamation{Identity: "val-b"}) {
			t.Fatalf("after %s: HolderValue %s, want {val-b, nil}", edit, showPro(p))
		}
		if err := b.e.Proclaim(ctx, []byte("addr-b2")); err != nil {
			t.Fatalf("Proclaim: %v", err)
		}
		if p := holderValue(); !samePro(p, leader.Proclamation{Identity: "val-b", Value: []byte("addr-b2")}) {
			t.Fatalf("after Proclaim: HolderValue %s", showPro(p))
		}
	}
	b.stop()
	rec.next("elected", "val-a")
	obs.wait(t, leader.Proclamation{Identity: "val-a", Value: []byte("addr-a")})
	bReports.mu.Lock()
	saw := false
	for _, p := range bReports.seen {
		saw = saw || samePro(p, leader.Proclamation{Identity: "val-a", Value: []byte("addr-a")})
	}
	bReports.mu.Unlock()
	if !saw {
		t.Errorf("OnLeaderValue of a follower never reported the leader's value: %v", bReports.seen)
	}
	for who, l := range map[string]*valueLog{"ObserveValues": obs, "OnLeaderValue": bReports} {
		l.mu.Lock()
		for _, p := range l.seen {
			if p.Value != nil && !strings.HasPrefix(string(p.Value), "addr-"+strings.TrimPrefix(p.Identity, "val-")) {
				t.Errorf("%s reported %s: one leader's value with another's identity", who, showPro(p))
			}
		}
		l.mu.Unlock()
	}
}

// Values are checked before they are run: size, a table name, Proclaim
// with values off; Proclaim by a follower is ErrNotLeader.
func TestValueConfig(t *testing.T) {
	base := func() elector.Config {
		return elector.Config{Connect: elector.DSN("postgres://localhost/x"), Key: testKey(t),
			Callbacks: elector.Callbacks{OnElected: func(ctx context.Context, _ leader.Leadership) { <-ctx.Done() }}}
	}
	c := base()
	c.Value = make([]byte, leader.MaxValueSize+1)
	var ce *elector.ConfigError
	if _, err := elector.New(c); !errors.As(err, &ce) || ce.Field != "Value" {
		t.Fatalf("a value of %d bytes: %v", len(c.Value), err)
	}
	c.Value = make([]byte, leader.MaxValueSize)
	if _, err := elector.New(c); err != nil {
		t.Fatalf("a value of %d bytes: %v", len(c.Value), err)
	}
	c = base()
	c.Values = elector.Values{Enabled: true, Table: "a.b.c"}
	if _, err := elector.New(c); !errors.As(err, &ce) || ce.Field != "Values.Table" {
		t.Fatalf("table a.b.c: %v", err)
	}
	e, err := elector.New(base())
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Proclaim(context.Background(), []byte("v")); !errors.As(err, &ce) {
		t.Fatalf("Proclaim with values off: %v", err)
	}
	c = base()
	c.Values.Enabled = true
	if e, err = elector.New(c); err != nil {
		t.Fatal(err)
	}
	if err := e.Proclaim(context.Background(), []byte("v")); !errors.Is(err, leader.ErrNotLeader) {
		t.Fatalf("Proclaim before Run: %v", err)
	}
	if err := e.Proclaim(context.Background(), make([]byte, leader.MaxValueSize+1)); !errors.As(err, &ce) {
		t.Fatalf("Proclaim of too large a value: %v", err)
	}
	if err := elector.ObserveValues(context.Background(), elector.DSN("postgres://localhost/x"), testKey(t), elector.Values{Table: "a.b.c"}, func(leader.Proclamation) {}); !errors.As(err, &ce) {
		t.Fatalf("ObserveValues of table a.b.c: %v", err)
	}
}

// A values table another role owns is refused, by the elector (Run
// returns ErrForeignTable), by ObserveValues and by HolderValue, unless
// that role is trusted: its owner could write any value for any leader.
func TestValueForeignTable(t *testing.T) {
	srv := sharedServer(t)
	r := testpg.NewRoles(t, srv)
	ctx := context.Background()
	if err := srv.Exec(ctx, "GRANT CREATE ON SCHEMA public TO "+r.Evil); err != nil {
		t.Fatal(err)
	}
	table := "foreign_values_" + r.Evil
	evil := r.EvilConn(t)
	for _, q := range []string{leader.ValuesTableSQL(table), "GRANT ALL ON " + table + " TO PUBLIC"} {
		if _, err := evil.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	key := testKey(t)
	cfg := elector.Config{Connect: elector.DSN(r.AppDSN), Key: key, Identity: "valued", Value: []byte("v"),
		Values:        elector.Values{Table: table},
		Callbacks:     elector.Callbacks{OnElected: func(ctx context.Context, _ leader.Leadership) { <-ctx.Done() }},
		RenewInterval: tInterval, RenewDeadline: tDeadline, LeaseDuration: tLease}
	e, err := elector.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, waitLong)
	defer cancel()
	if err := e.Run(rctx); !errors.Is(err, leader.ErrForeignTable) || !strings.Contains(err.Error(), r.Evil) {
		t.Fatalf("Run with a foreign values table: want ErrForeignTable naming %s, got %v", r.Evil, err)
	}
	if err := elector.ObserveValues(rctx, elector.DSN(r.AppDSN), key, elector.Values{Table: table}, func(leader.Proclamation) {}); !errors.Is(err, leader.ErrForeignTable) {
		t.Fatalf("ObserveValues of a foreign table: %v", err)
	}
	// Trusted, it leads; a reader that does not trust the owner gets
	// ErrForeignTable for the value the leader wrote.
	rec := newRecorder(t)
	startWith(t, rec, opts{dsn: r.AppDSN, key: key, id: "valued"}, func(c *elector.Config) {
		c.Value, c.Values = []byte("v"), elector.Values{Table: table, TrustedOwner: r.Evil}
	})
	rec.next("elected", "valued")
	app, err := pgx.Connect(ctx, r.AppDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close(ctx)
	eventually(t, "the trusted value", func() (bool, string) {
		p, err := leader.HolderValue(ctx, app, key, table, r.Evil)
		return err == nil && string(p.Value) == "v", fmt.Sprint(showPro(p), err)
	})
	if _, err := leader.HolderValue(ctx, app, key, table, ""); !errors.Is(err, leader.ErrForeignTable) {
		t.Fatalf("HolderValue of a foreign table's value: %v", err)
	}
}

// Leadership rotates among three electors, and each leader proclaims a
// new value right after its election: every follower reports every
// value, whichever way it learned of the new leader (its announcement,
// its value's, a lookup after its own step-down). The bench found a
// follower that learned the new leader from a value read, before its
// session's own lookup, and then missed the next Proclaim.
func TestValueFollowsRotation(t *testing.T) {
	waitsForRounds(t)
	srv := sharedServer(t)
	key := testKey(t)
	rec := newRecorder(t)
	logs := map[string]*valueLog{}
	els := map[string]*running{}
	for i := range 3 {
		id := fmt.Sprintf("rot-%d", i)
		logs[id] = newValueLog()
		els[id] = startWith(t, rec, opts{dsn: srv.DSN(), key: key, id: id}, func(c *elector.Config) {
			c.Value, c.Values.Table = []byte(id+"/0"), "values_rotation"
			c.Callbacks.OnLeaderValue = logs[id].add
			// The defaults: a step-down's cool-down (one interval) lets
			// the new leader proclaim before the old one looks it up.
			c.RenewInterval, c.RenewDeadline, c.LeaseDuration = time.Second, 3*time.Second, 6*time.Second
		})
	}
	cur := rec.next("elected", "").id
	for run := 1; run <= 6; run++ {
		want := leader.Proclamation{Identity: cur, Value: fmt.Appendf(nil, "%s/%d", cur, run)}
		if err := els[cur].e.Proclaim(context.Background(), want.Value); err != nil {
			t.Fatalf("run %d: Proclaim: %v", run, err)
		}
		for id, l := range logs {
			if id != cur {
				l.wait(t, want)
			}
		}
		if err := els[cur].e.Resign(context.Background()); err != nil {
			t.Fatal(err)
		}
		cur = rec.next("elected", "").id
	}
}
