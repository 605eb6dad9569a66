package group

import (
	"time"

	"github.com/pgleader/pgleader/leader"
)

// Status is a snapshot of a Group's state, for probes, metrics and status
// pages.
type Status struct {
	// Group and Identity are the group's name and this member's.
	Group, Identity string
	// Members are the group's members as the last scan saw them.
	Members []string
	// Eligible are the members the keys go to: the best-ranked ones (see
	// Config.Priority), every member when none is ranked. A member not
	// among them stands by (and is ready: it takes keys when no
	// better-ranked member is left).
	Eligible []string
	// Ranks are the ranked members' ranks, as their sessions'
	// application_names say; Strategy is this member's.
	Ranks    map[string]leader.Preference
	Strategy leader.Strategy
	// Keys is the size of the key set; Owned how many of them this member
	// leads now (0 once the trust window has passed).
	Keys, Owned int
	// Tenures counts the keys whose tenure is open, trusted or not (a
	// member that believes it leads them; a liveness probe compares it with
	// LastRound).
	Tenures int
	// Connected reports whether the member has a working session.
	Connected bool
	// LastRound is when the last full round (the session proven, and with
	// it every key this member leads) was sent; LastScan when the last
	// scan round (every key proven by its lock in pg_locks, the members
	// read) was; LastStep when the loop last finished any step: a round, a
	// light round, or a connection attempt. Liveness probes watch
	// LastRound and LastStep.
	LastRound, LastScan, LastStep time.Time
	// LastError is the last session error ("" when none since the last
	// full round).
	LastError string
	// Rounds and LightRounds count the rounds of this process's life, and
	// Scans the full rounds among them that scanned pg_locks; WatchWaits
	// the crash watch's lock waits (each one round trip that sleeps on the
	// server); Dropped the group notifications not believed (malformed, or
	// from a session that is not a member: NOTIFY is not authenticated, so
	// another role may send them).
	Rounds, LightRounds, Scans, WatchWaits, Dropped int64
	// LockTableFull counts the exchanges that found the server's lock
	// table full (SQLSTATE 53200: another session holds most of it): no key
	// was taken then, and the member tried again at its next full round.
	LockTableFull int64
	// Elected counts tenures begun; Demoted counts tenures ended, by
	// leader.ReasonLabel.
	Elected int64
	Demoted map[string]int64
	// RenewInterval, RenewDeadline, LeaseDuration and ReleaseTimeout are
	// the group's settings, for probes.
	RenewInterval, RenewDeadline, LeaseDuration, ReleaseTimeout time.Duration
}

// stats are the Group's counters (g.mu held).
type stats struct {
	connected           bool
	lastRound, lastStep time.Time
	lastScan            time.Time
	lastErr             string
	rounds, light       int64
	scans               int64
	watchWaits          int64
	dropped             int64 // group messages not believed (see heard)
	tableFull           int64 // exchanges that met a full lock table
	elected             int64
	demoted             map[string]int64
}

// Status returns a snapshot of the group's state.
func (g *Group) Status() Status {
	g.mu.Lock()
	defer g.mu.Unlock()
	owned := 0
	if !time.Now().After(g.st.trustEnd) {
		owned = g.ownedCount() // as len(Owned()), without building the list
	}
	st := Status{Group: g.cfg.Group, Identity: g.cfg.Identity, Members: append([]string(nil), g.st.members...),
		Keys: len(g.st.order), Owned: owned, Tenures: g.st.tenures(), Connected: g.stats.connected,
		LastRound: g.stats.lastRound, LastScan: g.stats.lastScan, LastStep: g.stats.lastStep, LastError: g.stats.lastErr,
		Rounds: g.stats.rounds, LightRounds: g.stats.light, Scans: g.stats.scans, WatchWaits: g.stats.watchWaits, Dropped: g.stats.dropped,
		LockTableFull: g.stats.tableFull, Elected: g.stats.elected, Demoted: map[string]int64{},
		RenewInterval: g.cfg.RenewInterval, RenewDeadline: g.cfg.RenewDeadline, LeaseDuration: g.cfg.LeaseDuration,
		ReleaseTimeout: g.cfg.ReleaseTimeout}
	for _, r := range leader.ReasonLabels {
		st.Demoted[r] = g.stats.demoted[r]
	}
	elig, _ := eligible(g.st.members, g.st.ranks)
	st.Eligible, st.Ranks, st.Strategy = append([]string(nil), elig...), map[string]leader.Preference{}, g.cfg.Strategy
	for m, r := range g.st.ranks {
		st.Ranks[m] = r.Preference
	}
	return st
}
