package leader_test

import (
	"errors"
	"testing"

	"github.com/pgleader/pgleader/leader"
)

func TestCompareVersions(t *testing.T) {
	// Each version is lower than the next (SemVer 2.0's own example, and
	// more).
	order := []string{"", "0.9.0", "1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta",
		"1.0.0-beta.2", "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0", "1.0.1", "1.2.0", "1.10.0", "2.0.0", "10.0.0"}
	for i, a := range order {
		for j, b := range order {
			want := 0
			switch {
			case i < j:
				want = -1
			case i > j:
				want = 1
			}
			if got := leader.CompareVersions(a, b); got != want {
				t.Errorf("CompareVersions(%q, %q) = %d, want %d", a, b, got, want)
			}
		}
	}
	for _, eq := range [][2]string{{"v1.2.3", "1.2.3"}, {"1.2.3+build.7", "1.2.3"}, {"1.2.3-rc.1+x", "v1.2.3-rc.1"}, {"junk", ""}} {
		if c := leader.CompareVersions(eq[0], eq[1]); c != 0 {
			t.Errorf("CompareVersions(%q, %q) = %d, want 0", eq[0], eq[1], c)
		}
	}
}

func TestValidVersion(t *testing.T) {
	for _, ok := range []string{"0.0.0", "1.2.3", "v1.2.3", "1.2.3-rc.1", "1.2.3-0.x-y", "1.2.3+build", "18446744073709551615.0.0"} {
		if err := leader.ValidVersion(ok); err != nil {
			t.Errorf("ValidVersion(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "1", "1.2", "1.2.3.4", "01.2.3", "1.2.x", "1.2.3-", "1.2.3-rc..1", "1.2.3-01", "1.2.3-ü", "-1.2.3", "18446744073709551616.0.0", " 1.2.3"} {
		if err := leader.ValidVersion(bad); !errors.Is(err, leader.ErrInvalidVersion) {
			t.Errorf("ValidVersion(%q) = %v, want ErrInvalidVersion", bad, err)
		}
	}
}

func TestCompare(t *testing.T) {
	p := func(prio int, v string) leader.Preference { return leader.Preference{Priority: prio, Version: v} }
	for _, c := range []struct {
		s    leader.Strategy
		a, b leader.Preference
		want int
	}{
		{leader.ByPriority, p(1, ""), p(0, ""), 1},
		{leader.ByPriority, p(0, ""), p(1, ""), -1},
		{leader.ByPriority, p(3, "1.0.0"), p(3, "2.0.0"), 0}, // versions play no part
		{leader.ByPriority, p(-1, ""), p(0, ""), -1},
		{leader.NewestVersion, p(0, "2.0.0"), p(9, "1.0.0"), 1}, // the version first
		{leader.NewestVersion, p(0, "1.0.0"), p(9, "2.0.0"), -1},
		{leader.NewestVersion, p(2, "2.0.0"), p(1, "2.0.0"), 1}, // then the priority
		{leader.NewestVersion, p(1, "2.0.0"), p(1, "v2.0.0"), 0},
		{leader.NewestVersion, p(0, "1.0.0"), p(5, ""), 1},
		{leader.OldestVersion, p(0, "1.0.0"), p(9, "2.0.0"), 1},
		{leader.OldestVersion, p(9, "2.0.0"), p(0, "1.0.0"), -1},
		{leader.OldestVersion, p(2, "1.0.0"), p(1, "1.0.0"), 1},
		{leader.OldestVersion, p(0, "1.0.0"), p(5, ""), 1}, // a version beats none either way
		{leader.OldestVersion, p(5, ""), p(0, "1.0.0"), -1},
		{leader.OldestVersion, p(0, "2.0.0-rc.1"), p(0, "2.0.0"), 1},
	} {
		if got := leader.Compare(c.s, c.a, c.b); got != c.want {
			t.Errorf("Compare(%v, %+v, %+v) = %d, want %d", c.s, c.a, c.b, got, c.want)
		}
	}
}
