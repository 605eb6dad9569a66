package leader_test

import (
	"testing"

	"github.com/pgleader/pgleader/leader"
)

// A rank written into an application_name reads back the same; a suffix
// that is not exactly a rank is part of a plain identity, the same for
// every elector and group member that reads it.
func TestRankApplicationName(t *testing.T) {
	for _, r := range []leader.Rank{
		{Strategy: leader.ByPriority, Preference: leader.Preference{Priority: 3}},
		{Strategy: leader.ByPriority, Preference: leader.Preference{Priority: -2}},
		{Strategy: leader.NewestVersion, Preference: leader.Preference{Version: "1.8.0"}},
		{Strategy: leader.OldestVersion, Preference: leader.Preference{Priority: 7, Version: "v2.0.0-rc.1+b7"}},
		{Strategy: leader.ByPriority, Preference: leader.Preference{Priority: 1, Version: "1.0.0"}},
	} {
		for _, id := range []string{"w", "worker-1", "a b", "x [y]", "a [b]", "x [P1] y"} {
			app := r.ApplicationName(id)
			got, gr, ok := leader.ParseApplicationName(app)
			if !ok || got != id || gr != r {
				t.Errorf("ParseApplicationName(%q) = %q %+v %v; want %q %+v", app, got, gr, ok, id, r)
			}
		}
	}
	if got := (leader.Rank{Strategy: leader.NewestVersion, Preference: leader.Preference{Version: "1.8.0"}}).ApplicationName("w"); got != "w [N0 1.8.0]" {
		t.Errorf("ApplicationName = %q, want %q", got, "w [N0 1.8.0]")
	}
	if got := (leader.Rank{Strategy: 9}).ApplicationName("w"); got != "w [P0]" {
		t.Errorf("an unknown strategy: ApplicationName = %q, want %q", got, "w [P0]")
	}
	for _, app := range []string{"", "worker-1", "w [X0]", "w [P01]", "w [P+1]", "w [P]", "w [N0 1.0]", "w [N0 ]", "w [P0", "[P0]", " [P0]",
		"w [P0 1.0.0 x]", "w [p0]", "w P0]", "w [P 0]", "w [P1] x"} {
		if id, r, ok := leader.ParseApplicationName(app); ok || id != app || r != (leader.Rank{}) {
			t.Errorf("ParseApplicationName(%q) = %q %+v %v; want the plain identity", app, id, r, ok)
		}
	}
}
