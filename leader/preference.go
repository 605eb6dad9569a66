package leader

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Strategy decides which standing candidate a leader prefers to itself,
// and hands over to of its own accord (see docs/rolling-upgrades.md).
type Strategy int

const (
	// ByPriority prefers the higher Preference.Priority; versions play no
	// part. With every priority equal (the default, 0), a leader leads
	// until it leaves: the first to come leads.
	ByPriority Strategy = iota
	// NewestVersion prefers the higher Preference.Version (semantic
	// versioning's precedence), then the higher priority: a rollout moves
	// leadership to the new version once one of its candidates stands,
	// and a rollback moves it back.
	NewestVersion
	// OldestVersion prefers the lower Preference.Version, then the higher
	// priority: a new version never leads while an old one still stands
	// (Kubernetes' coordinated leader election's default), and leadership
	// moves once the last candidate of the old version is gone.
	OldestVersion
)

// String returns the strategy's name.
func (s Strategy) String() string {
	switch s {
	case ByPriority:
		return "ByPriority"
	case NewestVersion:
		return "NewestVersion"
	case OldestVersion:
		return "OldestVersion"
	}
	return "Strategy(" + strconv.Itoa(int(s)) + ")"
}

// Preference is how a candidate ranks for leadership under a Strategy.
type Preference struct {
	// Priority: higher is preferred. Default 0.
	Priority int
	// Version is the candidate's semantic version ("1.4.2", "v2.0.0-rc.1";
	// a leading "v" is allowed). Under either version strategy, a
	// candidate without one is preferred to no candidate with one.
	Version string
}

// ErrInvalidVersion is wrapped by the error of a version that is not a
// semantic version.
var ErrInvalidVersion = errors.New("pgleader: not a semantic version")

// Compare reports whether a is preferred to b under s: +1 when a is, -1
// when b is, 0 when neither (a tie keeps the current leader). Under
// NewestVersion and OldestVersion the version decides first and the
// priority breaks a tie: a rollout's order must not be undone by a
// priority, which orders candidates within a version. Versions that do not
// parse compare as empty.
func Compare(s Strategy, a, b Preference) int {
	if s == NewestVersion || s == OldestVersion {
		c := CompareVersions(a.Version, b.Version)
		if s == OldestVersion && a.Version != "" && b.Version != "" {
			c = -c
		}
		if c != 0 {
			return c
		}
	}
	switch {
	case a.Priority > b.Priority:
		return 1
	case a.Priority < b.Priority:
		return -1
	}
	return 0
}

// CompareVersions compares two semantic versions by SemVer 2.0's
// precedence (build metadata is ignored): -1, 0 or +1. An empty or
// invalid version is lower than any valid one, and equal to another
// such.
func CompareVersions(a, b string) int {
	va, erra := parseVersion(a)
	vb, errb := parseVersion(b)
	switch {
	case erra != nil && errb != nil:
		return 0
	case erra != nil:
		return -1
	case errb != nil:
		return 1
	}
	for i := range 3 {
		if va.core[i] != vb.core[i] {
			if va.core[i] < vb.core[i] {
				return -1
			}
			return 1
		}
	}
	return comparePre(va.pre, vb.pre)
}

// ValidVersion returns nil for a semantic version ("1.2.3", "v1.2.3-rc.1+b7"),
// and an error wrapping ErrInvalidVersion otherwise.
func ValidVersion(v string) error {
	_, err := parseVersion(v)
	return err
}

type version struct {
	core [3]uint64
	pre  []string
}

func parseVersion(v string) (version, error) {
	bad := func(why string) (version, error) {
		return version{}, fmt.Errorf("%w: %q: %s", ErrInvalidVersion, v, why)
	}
	s := strings.TrimPrefix(v, "v")
	s, _, _ = strings.Cut(s, "+")
	s, pre, hasPre := strings.Cut(s, "-")
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return bad("want MAJOR.MINOR.PATCH")
	}
	var out version
	for i, p := range parts {
		if !numeric(p) || len(p) > 1 && p[0] == '0' {
			return bad("each of MAJOR.MINOR.PATCH must be a number without leading zeros")
		}
		n, err := strconv.ParseUint(p, 10, 64)
		if err != nil {
			return bad("a number out of range")
		}
		out.core[i] = n
	}
	if hasPre {
		out.pre = strings.Split(pre, ".")
		for _, id := range out.pre {
			if id == "" || strings.Trim(id, "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-") != "" ||
				numeric(id) && len(id) > 1 && id[0] == '0' {
				return bad("a pre-release identifier must be alphanumerics and hyphens, and a numeric one has no leading zeros")
			}
		}
	}
	return out, nil
}

func numeric(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// comparePre compares pre-release identifiers: none ranks above any.
func comparePre(a, b []string) int {
	switch {
	case len(a) == 0 && len(b) == 0:
		return 0
	case len(a) == 0:
		return 1
	case len(b) == 0:
		return -1
	}
	for i := 0; i < len(a) && i < len(b); i++ {
		if c := compareIdent(a[i], b[i]); c != 0 {
			return c
		}
	}
	switch {
	case len(a) < len(b):
		return -1
	case len(a) > len(b):
		return 1
	}
	return 0
}

func compareIdent(a, b string) int {
	na, nb := numeric(a), numeric(b)
	switch {
	case na && nb:
		if len(a) != len(b) {
			if len(a) < len(b) {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	case na:
		return -1
	case nb:
		return 1
	}
	return strings.Compare(a, b)
}
