package elector_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/leader"
)

// A shared database: the tests below run pgleader as an ordinary role,
// app, beside a hostile one, evil: a LOGIN role with no membership and no
// grant but what PUBLIC has. Whatever evil says (NOTIFY) or holds (any
// advisory lock, pgleader's own space included) must not make an elector
// or a group lead, yield, queue or report a leader the server does not
// prove.

// A role whose search_path puts a schema another role writes before
// pg_catalog: the functions that role put there never run in an
// elector's session, so followers never "win" a lock held by the leader,
// and at most one elector leads at any moment.
func TestShadowedBuiltinsDoNotElect(t *testing.T) {
	srv := sharedServer(t)
	r := testpg.NewRoles(t, srv)
	r.Shadow(t)
	rec := newRecorder(t)
	key := testKey(t)
	var leading atomic.Int32
	var twice atomic.Bool
	onLead := func(ctx context.Context, _ leader.Leadership) {
		if leading.Add(1) > 1 {
			twice.Store(true)
		}
		<-ctx.Done()
		leading.Add(-1)
	}
	var els []*running
	for i := range 3 {
		els = append(els, start(t, rec, opts{dsn: r.AppDSN, key: key, id: fmt.Sprintf("shadow-%d", i), onLead: onLead}))
	}
	first := rec.next("elected", "")
	// Every follower stands (queues or watches) for several rounds: none
	// may be elected while the first leads.
	waitRounds(t, els, 4)
	if n := rec.count("elected", first.id); n != 1 || twice.Load() {
		t.Fatalf("%s elected %d times, two at once: %v", first.id, n, twice.Load())
	}
	for _, rn := range els {
		if rn.e.Identity() != first.id && rec.count("elected", rn.e.Identity()) > 0 {
			t.Fatalf("%s was elected while %s led", rn.e.Identity(), first.id)
		}
	}
	leaders := 0
	for _, rn := range els {
		if rn.e.IsLeader() {
			leaders++
		}
	}
	if leaders != 1 {
		t.Fatalf("%d electors report IsLeader", leaders)
	}
}

// The same for a Group: every key is elected once, on one member.
func TestShadowedBuiltinsDoNotElectGroupKeys(t *testing.T) {
	srv := sharedServer(t)
	r := testpg.NewRoles(t, srv)
	r.Shadow(t)
	w := newGroupWatch(t)
	keys := groupKeys(t.Name(), 10)
	var ms []*member
	for _, id := range []string{"g-a", "g-b"} {
		ms = append(ms, startMember(t, r.AppDSN, t.Name(), id, keys, w))
	}
	balanced(t, w, len(keys), 5, 5, "g-a", "g-b")
	w.mu.Lock()
	before := 0
	for _, n := range w.elected {
		before += n
	}
	w.mu.Unlock()
	// Several full rounds of both members: nothing is elected again.
	for _, m := range ms {
		st := m.g.Status()
		eventually(t, "ten more rounds", func() (bool, string) {
			return m.g.Status().Rounds >= st.Rounds+10, ""
		})
	}
	w.mu.Lock()
	after := 0
	for _, n := range w.elected {
		after += n
	}
	w.mu.Unlock()
	if after != before {
		t.Errorf("%d elections during ten quiet rounds", after-before)
	}
	if owned := len(ms[0].g.Owned()) + len(ms[1].g.Owned()); owned != len(keys) {
		t.Errorf("the members report %d keys owned, of %d", owned, len(keys))
	}
}

// A terms table another role created first (it could rewind a term, and
// an old leader's writes would pass its fence) is refused with
// ErrForeignTable, by an Elector and a Group alike, unless
// Fencing.TrustedOwner names its owner.
func TestForeignTermsTableRefused(t *testing.T) {
	srv := sharedServer(t)
	r := testpg.NewRoles(t, srv)
	ctx := context.Background()
	if err := srv.Exec(ctx, "GRANT CREATE ON SCHEMA public TO "+r.Evil); err != nil {
		t.Fatal(err)
	}
	table := "foreign_terms_" + r.Evil
	evil := r.EvilConn(t)
	for _, q := range []string{leader.TermsTableSQL(table), "GRANT ALL ON " + table + " TO PUBLIC"} {
		if _, err := evil.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	key := testKey(t)
	cfg := func(trusted string) elector.Config {
		return elector.Config{Connect: elector.DSN(r.AppDSN), Key: key, Identity: "fenced",
			Callbacks:     elector.Callbacks{OnElected: func(ctx context.Context, _ leader.Leadership) { <-ctx.Done() }},
			RenewInterval: tInterval, RenewDeadline: tDeadline, LeaseDuration: tLease,
			Fencing: elector.Fencing{Enabled: true, Table: table, NoHistory: true, TrustedOwner: trusted}}
	}
	e, err := elector.New(cfg(""))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, waitLong)
	defer cancel()
	if err := e.Run(rctx); !errors.Is(err, leader.ErrForeignTable) || !strings.Contains(err.Error(), r.Evil) {
		t.Fatalf("Run with a foreign terms table: want ErrForeignTable naming %s, got %v", r.Evil, err)
	}
	g, err := elector.NewGroup(elector.GroupConfig{Connect: elector.DSN(r.AppDSN), Group: t.Name(), Keys: []leader.Key{key}, Identity: "fenced",
		Callbacks:     elector.Callbacks{OnElected: func(ctx context.Context, _ leader.Leadership) { <-ctx.Done() }},
		RenewInterval: tInterval, RenewDeadline: tDeadline, LeaseDuration: tLease,
		Fencing: elector.Fencing{Enabled: true, Table: table}})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Run(rctx); !errors.Is(err, leader.ErrForeignTable) {
		t.Fatalf("Group.Run with a foreign terms table: want ErrForeignTable, got %v", err)
	}
	// Trusted: it leads, with the table's schema in its Leadership.
	rec := newRecorder(t)
	var got leader.Leadership
	var mu sync.Mutex
	startWith(t, rec, opts{dsn: r.AppDSN, key: key, id: "trusting", onLead: func(ctx context.Context, l leader.Leadership) {
		mu.Lock()
		got = l
		mu.Unlock()
		<-ctx.Done()
	}}, func(c *elector.Config) { c.Fencing = cfg(r.Evil).Fencing })
	rec.next("elected", "trusting")
	mu.Lock()
	defer mu.Unlock()
	if got.Term != 1 || got.TermsTable != "public."+table {
		t.Fatalf("trusted table: term %d in %q", got.Term, got.TermsTable)
	}
}
