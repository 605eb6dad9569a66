package leader

import (
	"strconv"
	"strings"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
)

// Rank is a ranked candidate's strategy and preference, as its sessions'
// application_name carries it after its identity: "worker-1 [N0 1.8.0]"
// (the strategy's letter P, N or O, the priority, the version when there
// is one). An elector or a group member with a Priority or a Version
// names its sessions so, and pgleader reads a candidate's rank from the
// candidate's own session (pg_stat_activity), never from a message.
type Rank struct {
	Strategy Strategy
	Preference
}

// strategyLetters name the strategies in application_name, in Strategy
// order.
const strategyLetters = "PNO"

// ApplicationName returns the application_name of the candidate identity
// with rank r.
func (r Rank) ApplicationName(identity string) string {
	letter := strategyLetters[0]
	if r.Strategy > ByPriority && int(r.Strategy) < len(strategyLetters) {
		letter = strategyLetters[r.Strategy]
	}
	s := identity + " [" + string(letter) + strconv.Itoa(r.Priority)
	if r.Version != "" {
		s += " " + r.Version
	}
	return s + "]"
}

// ParseApplicationName splits a session's application_name into the
// candidate's identity and, when it ends in one, its rank (ranked is then
// true); a suffix that does not parse is part of a plain identity. Any
// role names its sessions as it likes: a rank means something only for a
// session that pg_locks shows standing for a key, of a role trusted with
// it.
func ParseApplicationName(app string) (identity string, r Rank, ranked bool) {
	id, letter, prio, version, ok := lockconn.SplitName(app)
	p, err := strconv.Atoi(prio)
	if !ok || err != nil || strconv.Itoa(p) != prio || version != "" && ValidVersion(version) != nil {
		return app, Rank{}, false
	}
	return id, Rank{Strategy: Strategy(strings.IndexByte(strategyLetters, letter)), Preference: Preference{Priority: p, Version: version}}, true
}
