package group

import (
	"fmt"
	"slices"

	"go.uber.org/zap"

	"github.com/pgleader/pgleader/leader"
)

// Ranked members (Config.Priority, Version and Strategy). The keys go to
// the best-ranked members only (the assignment spreads them over those);
// the others stand by, their crash watch on, and take keys when no
// better-ranked member is left. So during a rolling upgrade each key
// changes version once: under NewestVersion when the first member of the
// new version joins, under OldestVersion when the last member of the old
// version leaves.
//
// A ranked member's sessions carry its rank in their application_name,
// after its identity: "worker-1 [N0 1.8.0]" (the strategy's letter P, N
// or O, the priority, and the version when it has one). Every member's
// scan reads the same names from pg_stat_activity, so every member
// computes the same tiers in the same round, with no message to miss or
// forge: a rank is proven as a membership is, from the member's own
// session (a session of the group's login role that holds its roster
// lock). An unranked member's application_name is its identity, as it
// was before ranks existed.

// splitMembers parses the application_names a scan read: the members'
// names (sorted, without duplicates) and the ranks of the ranked ones.
func splitMembers(apps []string, pids map[uint32]string) ([]string, map[string]leader.Rank, map[uint32]string) {
	names := make([]string, 0, len(apps))
	var ranks map[string]leader.Rank
	for _, a := range apps {
		name, r, ok := leader.ParseApplicationName(a)
		names = append(names, name)
		if ok {
			if ranks == nil {
				ranks = map[string]leader.Rank{}
			}
			ranks[name] = r
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	byPID := make(map[uint32]string, len(pids))
	for pid, a := range pids {
		name, _, _ := leader.ParseApplicationName(a)
		byPID[pid] = name
	}
	return names, ranks, byPID
}

// eligible returns the members the keys are assigned to: those whose rank
// is the best there is under the ranked members' strategy (an unranked
// member ranks as priority 0 with no version); every member when none is
// ranked, or when the ranked ones disagree on the strategy (split reports
// that: the members must use one strategy, and no member can decide which
// one wins, so the group keys ignore ranks until they agree). members is
// sorted, and so is the result.
func eligible(members []string, ranks map[string]leader.Rank) (out []string, split bool) {
	if len(ranks) == 0 {
		return members, false
	}
	s, first := leader.ByPriority, true
	for _, m := range members {
		if r, ok := ranks[m]; ok {
			if !first && r.Strategy != s {
				return members, true
			}
			s, first = r.Strategy, false
		}
	}
	var best leader.Preference
	for i, m := range members {
		if p := ranks[m].Preference; i == 0 || leader.Compare(s, p, best) > 0 {
			best = p
		}
	}
	for _, m := range members {
		if leader.Compare(s, ranks[m].Preference, best) == 0 {
			out = append(out, m)
		}
	}
	return out, false
}

// noteTiers logs, when it changes, which members the keys go to, or that
// the ranked members disagree on the strategy (g.mu held).
func (g *Group) noteTiers() {
	st := &g.st
	if len(st.ranks) == 0 && g.tiers == "" {
		return
	}
	out, split := eligible(st.members, st.ranks)
	now := fmt.Sprint(split, out, st.members)
	if now == g.tiers {
		return
	}
	g.tiers = now
	switch {
	case split:
		g.log.Warn("the group's ranked members use different strategies: the keys go to every member, ranks ignored, until they agree",
			zap.Strings("members", g.rankedNames()))
	case len(out) < len(st.members):
		g.log.Info("the keys go to the best-ranked members; the others stand by",
			zap.Strings("eligible", out), zap.Strings("members", g.rankedNames()))
	default:
		g.log.Info("the keys go to every member: they rank the same", zap.Strings("members", g.rankedNames()))
	}
}

// rankedNames are the members with their ranks, as their sessions name
// them (g.mu held).
func (g *Group) rankedNames() []string {
	out := make([]string, 0, len(g.st.members))
	for _, m := range g.st.members {
		if r, ok := g.st.ranks[m]; ok {
			m = r.ApplicationName(m)
		}
		out = append(out, m)
	}
	return out
}
