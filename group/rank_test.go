package group

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/pgleader/pgleader/leader"
)

func rk(s leader.Strategy, prio int, version string) leader.Rank {
	return leader.Rank{Strategy: s, Preference: leader.Preference{Priority: prio, Version: version}}
}

// The keys go to the members of the best rank under the ranked members'
// strategy; to all of them when none is ranked or when the ranked ones
// disagree on the strategy.
func TestEligible(t *testing.T) {
	members := []string{"a", "b", "c"}
	for _, tc := range []struct {
		name  string
		ranks map[string]leader.Rank
		want  []string
		split bool
	}{
		{"none ranked", nil, members, false},
		{"priority", map[string]leader.Rank{"b": rk(leader.ByPriority, 2, "")}, []string{"b"}, false},
		{"equal priorities", map[string]leader.Rank{"a": rk(leader.ByPriority, 2, ""), "c": rk(leader.ByPriority, 2, "")}, []string{"a", "c"}, false},
		{"a priority below an unranked one", map[string]leader.Rank{"a": rk(leader.ByPriority, -1, "")}, []string{"b", "c"}, false},
		{"newest", map[string]leader.Rank{"a": rk(leader.NewestVersion, 0, "1.0.0"), "b": rk(leader.NewestVersion, 0, "2.0.0"),
			"c": rk(leader.NewestVersion, 0, "2.0.0")}, []string{"b", "c"}, false},
		{"oldest", map[string]leader.Rank{"a": rk(leader.OldestVersion, 0, "1.0.0"), "b": rk(leader.OldestVersion, 0, "2.0.0"),
			"c": rk(leader.OldestVersion, 0, "2.0.0")}, []string{"a"}, false},
		{"version before priority", map[string]leader.Rank{"a": rk(leader.NewestVersion, 9, "1.0.0"), "b": rk(leader.NewestVersion, 0, "2.0.0"),
			"c": rk(leader.NewestVersion, 1, "2.0.0")}, []string{"c"}, false},
		{"a version over none", map[string]leader.Rank{"c": rk(leader.OldestVersion, 0, "3.0.0")}, []string{"c"}, false},
		{"pre-release below release", map[string]leader.Rank{"a": rk(leader.NewestVersion, 0, "2.0.0-rc.1"), "b": rk(leader.NewestVersion, 0, "2.0.0")},
			[]string{"b"}, false},
		{"strategies disagree", map[string]leader.Rank{"a": rk(leader.NewestVersion, 0, "1.0.0"), "b": rk(leader.OldestVersion, 0, "2.0.0")}, members, true},
		{"a rank of a member gone", map[string]leader.Rank{"z": rk(leader.ByPriority, 5, "")}, members, false},
	} {
		got, split := eligible(members, tc.ranks)
		if !reflect.DeepEqual(got, tc.want) || split != tc.split {
			t.Errorf("%s: eligible = %v %v, want %v %v", tc.name, got, split, tc.want, tc.split)
		}
	}
}

// A scan that reads the same names with new ranks assigns again: a member
// that now ranks below another hands every key over, and takes none.
func TestPlanStandsByBelowABetterRank(t *testing.T) {
	f := newFixture(12, "a", "a", "b")
	for _, k := range f.mine() {
		f.lead(k, phaseLeading, false)
	}
	ranks := map[string]leader.Rank{"a": rk(leader.NewestVersion, 0, "1.0.0"), "b": rk(leader.NewestVersion, 0, "2.0.0")}
	a := planPure(t, f.st, input{now: t0, full: true, scanned: true, held: held(f.mine()...), members: []string{"a", "b"}, ranks: ranks})
	if a.assign == nil || !reflect.DeepEqual(a.assign.members, []string{"b"}) {
		t.Fatalf("assignment %+v, want every key to b", a.assign)
	}
	var handed []tag
	for _, h := range a.handOver {
		if !errors.Is(h.reason, leader.ErrResigned) {
			t.Errorf("handed over with %v, want ErrResigned", h.reason)
		}
		handed = append(handed, h.k)
	}
	same(t, "handOver", handed, f.mine())
	same(t, "want", a.want, nil)

	// And the member that ranks best takes every key.
	g := newFixture(12, "b", "a", "b")
	a = planPure(t, g.st, input{now: t0, full: true, scanned: true, held: held(), members: []string{"a", "b"}, ranks: ranks})
	same(t, "want", a.want, g.keys)

	// A light round goes by the ranks the last scan read.
	g.st.ranks = ranks
	a = planPure(t, g.st, input{now: t0, full: false})
	if a.assign == nil || !reflect.DeepEqual(a.assign.members, []string{"b"}) {
		t.Fatalf("a light round's assignment %+v, want every key to b", a.assign)
	}
}

// A ranked member's Identity must fit application_name with its rank, and
// must not itself read as a ranked name.
func TestRankConfig(t *testing.T) {
	base := Config{Connect: leader.DSN("postgres://localhost/x"), Group: "g", Identity: "w",
		Callbacks: Callbacks{OnElected: func(context.Context, leader.Leadership) {}}}
	for _, tc := range []struct {
		field string
		edit  func(*Config)
	}{
		{"Version", func(c *Config) { c.Strategy = leader.NewestVersion }},
		{"Version", func(c *Config) { c.Version = "1.0" }},
		{"Strategy", func(c *Config) { c.Strategy = 7 }},
		{"Identity", func(c *Config) { c.Identity = "w [P1]" }},
		{"Identity", func(c *Config) {
			c.Identity, c.Version = "a-very-long-member-identity-that-fills-most-of-the-name", "10.20.30"
		}},
	} {
		c := base
		tc.edit(&c)
		_, err := New(c)
		var ce *leader.ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field {
			t.Errorf("%+v: New = %v, want a ConfigError on %s", c, err, tc.field)
		}
	}
	c := base
	c.Priority, c.Version, c.Strategy = 2, "1.2.3", leader.OldestVersion
	g, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	if got := g.cfg.appName(); got != "w [O2 1.2.3]" {
		t.Errorf("appName = %q", got)
	}
	if base.appName() != "w" {
		t.Errorf("an unranked member's appName = %q, want its identity", base.appName())
	}
}
