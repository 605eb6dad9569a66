package health

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/pgleader/pgleader/group"
	"github.com/pgleader/pgleader/leader"
)

// GroupChecker answers liveness and readiness for one group.Group, with
// the same rules as Checker: a member that believes it leads keys but whose
// last full round is older than RenewDeadline plus Tolerance is wedged; a
// loop that has not finished a step for StallTimeout is stuck; anything
// else is alive, a member without keys included. Readiness always
// succeeds, or with LeaderOnly only while the member leads at least one
// key (the same rollout caveat as Checker's applies).
type GroupChecker struct {
	g    *group.Group
	opts Options
	now  func() time.Time
}

// NewGroupChecker returns a GroupChecker for g.
func NewGroupChecker(g *group.Group, opts Options) *GroupChecker {
	st := g.Status()
	opts.setDefaults(st.RenewInterval, st.LeaseDuration, st.ReleaseTimeout, "pgleader-group")
	return &GroupChecker{g: g, opts: opts, now: time.Now}
}

// Live returns nil when the member is alive, and an error wrapping
// ErrNotLive that says why not.
func (c *GroupChecker) Live() error { return c.live(c.g.Status()) }

func (c *GroupChecker) live(st group.Status) error {
	now := c.now()
	if st.Tenures > 0 && !st.LastRound.IsZero() {
		if since := now.Sub(st.LastRound); since > st.RenewDeadline+c.opts.Tolerance {
			return fmt.Errorf("%w: believes it leads %d keys of group %s, but no round has succeeded for %s (trust window %s)",
				ErrNotLive, st.Tenures, st.Group, since.Round(time.Millisecond), st.RenewDeadline)
		}
	}
	if !st.LastStep.IsZero() {
		if since := now.Sub(st.LastStep); since > c.opts.StallTimeout {
			return fmt.Errorf("%w: the group's loop has not finished a step for %s (stall timeout %s)",
				ErrNotLive, since.Round(time.Millisecond), c.opts.StallTimeout)
		}
	}
	return nil
}

// Ready returns nil when the member should receive traffic: always, or
// with LeaderOnly only while it leads a key.
func (c *GroupChecker) Ready() error {
	if !c.opts.LeaderOnly || c.g.Status().Owned > 0 {
		return nil
	}
	return fmt.Errorf("%w: leads no key of the group", ErrNotReady)
}

// GroupStatusJSON is the JSON document GroupChecker's StatusHandler serves.
type GroupStatusJSON struct {
	Group       string           `json:"group"`
	Identity    string           `json:"identity"`
	Members     []string         `json:"members"`
	Keys        int              `json:"keys"`
	Owned       int              `json:"owned"`
	Connected   bool             `json:"connected"`
	LastRound   *time.Time       `json:"last_round"`
	LastError   string           `json:"last_error"`
	Rounds      int64            `json:"rounds"`
	LightRounds int64            `json:"light_rounds"`
	Elected     int64            `json:"elected"`
	Demoted     map[string]int64 `json:"demoted"`
	Live        bool             `json:"live"`
	Ready       bool             `json:"ready"`
	// Eligible are the members the keys go to (the best-ranked; every
	// member when none is ranked), Ranks the ranked members' ranks, and
	// Strategy this member's (see group.Config.Priority).
	Eligible []string            `json:"eligible"`
	Ranks    map[string]RankJSON `json:"ranks,omitempty"`
	Strategy string              `json:"strategy"`
}

// RankJSON is a ranked member's rank.
type RankJSON struct {
	Priority int    `json:"priority"`
	Version  string `json:"version,omitempty"`
}

// Snapshot returns the state in GroupStatusJSON's shape.
func (c *GroupChecker) Snapshot() GroupStatusJSON {
	st := c.g.Status()
	var last *time.Time
	if !st.LastRound.IsZero() {
		last = &st.LastRound
	}
	members := st.Members
	if members == nil {
		members = []string{}
	}
	eligible := st.Eligible
	if eligible == nil {
		eligible = []string{}
	}
	out := GroupStatusJSON{Group: st.Group, Identity: st.Identity, Members: members, Keys: st.Keys, Owned: st.Owned,
		Connected: st.Connected, LastRound: last, LastError: st.LastError, Rounds: st.Rounds, LightRounds: st.LightRounds,
		Elected: st.Elected, Demoted: st.Demoted, Live: c.live(st) == nil, Ready: c.Ready() == nil,
		Eligible: eligible, Strategy: st.Strategy.String()}
	for m, r := range st.Ranks {
		if out.Ranks == nil {
			out.Ranks = map[string]RankJSON{}
		}
		out.Ranks[m] = RankJSON{Priority: r.Priority, Version: r.Version}
	}
	return out
}

// Handler serves /livez, /readyz and /status, and with AllowResign
// POST /resign?key=NAME (Group.Resign of the key named NAME).
func (c *GroupChecker) Handler() http.Handler {
	return probeMux(c.Live, c.Ready, jsonHandler(func() any { return c.Snapshot() }), c.opts.AllowResign, c.ResignHandler())
}

// ResignHandler hands the key named by the query parameter key over, on
// POST: 200 "resigned" once its OnDemoted ran, 409 when this member does
// not lead it, 400 without a key, 405 for other methods.
func (c *GroupChecker) ResignHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := r.URL.Query().Get("key")
		if name == "" && r.Method == http.MethodPost {
			http.Error(w, "name the key: POST /resign?key=NAME", http.StatusBadRequest)
			return
		}
		st := c.g.Status()
		serveResign(w, r, st.ReleaseTimeout+st.RenewDeadline, "this member does not lead "+name, func(ctx context.Context) error {
			return c.g.Resign(ctx, leader.KeyFromName(name))
		})
	})
}

// LiveFunc returns liveness as a plain func(context.Context) error.
func (c *GroupChecker) LiveFunc() func(context.Context) error {
	return func(context.Context) error { return c.Live() }
}

// ReadyFunc returns readiness as a plain func(context.Context) error.
func (c *GroupChecker) ReadyFunc() func(context.Context) error {
	return func(context.Context) error { return c.Ready() }
}
