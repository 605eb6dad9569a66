// Package health turns an Elector's state into probes that tell the truth,
// for leaders and followers alike, and into Prometheus metrics.
//
// # Liveness
//
// Live fails only when the process is broken in a way a restart would fix:
//
//   - the elector believes it leads (a tenure is open) but no renew has
//     succeeded for longer than RenewDeadline plus Tolerance, so its own
//     step-down did not happen: the loop is wedged; or
//   - the elector's loop has not finished a step (a campaign round, a renew
//     or a connection attempt) for StallTimeout: it is stuck, for example
//     behind an OnElected that ignores its context.
//
// A follower waiting patiently is alive. During a database outage the
// elector keeps making connection attempts, each of them a finished step,
// so every replica stays alive: an outage never makes a whole fleet fail
// liveness and restart together. A leader that loses its database steps
// down within RenewDeadline and is then a live follower.
//
// # Readiness
//
// In the default mode Ready always succeeds. With LeaderOnly it succeeds
// only while the elector leads (IsLeader), so that a Service in front of an
// active/passive pool sends traffic only to the active replica. Do not use
// LeaderOnly for pods a Deployment or StatefulSet rolls: a rollout waits
// for new pods to become ready, and new pods are followers, so it stalls
// (docs/kubernetes.md says what to do instead).
// It flips as soon as the elector is elected or steps down.
//
// # Status
//
// StatusHandler serves the state as JSON; its shape is StatusJSON.
package health

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/leader"
)

// ErrNotLive and ErrNotReady are wrapped by the probes' errors.
var (
	ErrNotLive  = errors.New("health: not live")
	ErrNotReady = errors.New("health: not ready")
)

// Options tune the probes. Zero values take the defaults.
type Options struct {
	// LeaderOnly makes readiness follow leadership.
	LeaderOnly bool
	// Tolerance is added to RenewDeadline before a leader without a
	// successful renew counts as wedged. Default: one RenewInterval plus 1s.
	Tolerance time.Duration
	// StallTimeout is how long the elector's loop may go without finishing
	// a step. Default: 2 x LeaseDuration + ReleaseTimeout.
	StallTimeout time.Duration
	// Name is the check's name for Kubernetes-style registries. Default
	// "pgleader".
	Name string
	// AllowResign makes Handler also serve POST /resign, which makes this
	// process's elector step down gracefully (Elector.Resign). Off by
	// default: anyone who can reach the handler could then move
	// leadership, so serve it on a port only operators reach. To hand
	// over from outside the process, to a named candidate and with a role
	// check, see elector.RequestResign and pgleader resign.
	AllowResign bool
}

// Checker answers liveness and readiness for one elector.
type Checker struct {
	e    elector.Candidate
	opts Options
	now  func() time.Time
}

// NewChecker returns a Checker for e.
func NewChecker(e elector.Candidate, opts Options) *Checker {
	st := e.Status()
	opts.setDefaults(st.RenewInterval, st.LeaseDuration, st.ReleaseTimeout, "pgleader")
	return &Checker{e: e, opts: opts, now: time.Now}
}

// setDefaults fills in the zero fields from an elector's or a group's
// timings.
func (o *Options) setDefaults(interval, lease, release time.Duration, name string) {
	if o.Tolerance == 0 {
		o.Tolerance = interval + time.Second
	}
	if o.StallTimeout == 0 {
		o.StallTimeout = 2*lease + release
	}
	if o.Name == "" {
		o.Name = name
	}
}

// Live returns nil when the elector is alive, and an error wrapping
// ErrNotLive that says why not.
func (c *Checker) Live() error {
	return c.live(c.e.Status())
}

func (c *Checker) live(st elector.Status) error {
	now := c.now()
	if st.Tenure && !st.LastRenew.IsZero() {
		if since := now.Sub(st.LastRenew); since > st.RenewDeadline+c.opts.Tolerance {
			return fmt.Errorf("%w: believes it leads %s, but no renew has succeeded for %s (trust window %s)",
				ErrNotLive, st.Key, since.Round(time.Millisecond), st.RenewDeadline)
		}
	}
	if since := now.Sub(st.LastRound); since > c.opts.StallTimeout {
		return fmt.Errorf("%w: the elector loop has not finished a step for %s (stall timeout %s)",
			ErrNotLive, since.Round(time.Millisecond), c.opts.StallTimeout)
	}
	return nil
}

// Ready returns nil when the elector should receive traffic: always, or
// with LeaderOnly only while it leads.
func (c *Checker) Ready() error {
	if !c.opts.LeaderOnly {
		return nil
	}
	if c.e.IsLeader() {
		return nil
	}
	if l := c.e.Leader(); l != "" {
		return fmt.Errorf("%w: not the leader (the leader is %s)", ErrNotReady, l)
	}
	return fmt.Errorf("%w: not the leader", ErrNotReady)
}

// StatusJSON is the JSON document StatusHandler serves. Times are RFC 3339;
// absent times are null.
type StatusJSON struct {
	Identity  string     `json:"identity"`
	Key       string     `json:"key"`
	Leading   bool       `json:"leading"`
	Leader    string     `json:"leader"`
	Term      int64      `json:"term"`
	Since     *time.Time `json:"since"`
	LastRenew *time.Time `json:"last_renew"`
	LastError string     `json:"last_error"`
	Connected bool       `json:"connected"`
	Live      bool       `json:"live"`
	Ready     bool       `json:"ready"`
	// The elector's rank (elector.Config.Priority, Version, Strategy)
	// and, while it leads, why it leads and the ranks candidates told it
	// (see elector.Status).
	Priority   int             `json:"priority"`
	Version    string          `json:"version,omitempty"`
	Strategy   string          `json:"strategy"`
	Why        string          `json:"why,omitempty"`
	Candidates []CandidateJSON `json:"candidates,omitempty"`
}

// CandidateJSON is a rank a candidate told the leader.
type CandidateJSON struct {
	PID      uint32    `json:"pid"`
	Priority int       `json:"priority"`
	Version  string    `json:"version,omitempty"`
	Since    time.Time `json:"since"`
}

// Snapshot returns the state in StatusJSON's shape.
func (c *Checker) Snapshot() StatusJSON {
	st := c.e.Status()
	tp := func(t time.Time) *time.Time {
		if t.IsZero() {
			return nil
		}
		return &t
	}
	out := StatusJSON{
		Identity: st.Identity, Key: st.Key.String(), Leading: st.Leading, Leader: st.Leader,
		Term: st.Term, Since: tp(st.Since), LastRenew: tp(st.LastRenew), LastError: st.LastError,
		Connected: st.Connected, Live: c.live(st) == nil, Ready: c.Ready() == nil,
		Priority: st.Priority, Version: st.Version, Strategy: st.Strategy.String(), Why: st.Why,
	}
	for _, cand := range st.Candidates {
		out.Candidates = append(out.Candidates, CandidateJSON{PID: cand.PID, Priority: cand.Priority, Version: cand.Version, Since: cand.Since})
	}
	return out
}

func probeHandler(check func() error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if err := check(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, err)
			return
		}
		fmt.Fprintln(w, "ok")
	})
}

// LivezHandler answers 200 "ok" when live, else 503 with the reason.
func (c *Checker) LivezHandler() http.Handler { return probeHandler(c.Live) }

// ReadyzHandler answers 200 "ok" when ready, else 503 with the reason.
func (c *Checker) ReadyzHandler() http.Handler { return probeHandler(c.Ready) }

// StatusHandler serves Snapshot as JSON.
func (c *Checker) StatusHandler() http.Handler {
	return jsonHandler(func() any { return c.Snapshot() })
}

// jsonHandler serves v() as JSON, never cached.
func jsonHandler(v func() any) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		json.NewEncoder(w).Encode(v())
	})
}

// Handler serves /livez, /readyz and /status.
func (c *Checker) Handler() http.Handler {
	return probeMux(c.Live, c.Ready, c.StatusHandler(), c.opts.AllowResign, c.ResignHandler())
}

// probeMux serves the probes, the status and, when allowed, /resign.
func probeMux(live, ready func() error, status http.Handler, allowResign bool, resign http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/livez", probeHandler(live))
	mux.Handle("/readyz", probeHandler(ready))
	mux.Handle("/status", status)
	if allowResign {
		mux.Handle("/resign", resign)
	}
	return mux
}

// serveResign answers a resign request: only POST, bounded by timeout;
// 200 "resigned" once resign returned, 409 with notLeader when this
// process does not lead.
func serveResign(w http.ResponseWriter, r *http.Request, timeout time.Duration, notLeader string, resign func(context.Context) error) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "use POST", http.StatusMethodNotAllowed)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	switch err := resign(ctx); {
	case errors.Is(err, leader.ErrNotLeader):
		http.Error(w, notLeader, http.StatusConflict)
	case err != nil:
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
	default:
		w.Write([]byte("resigned\n"))
	}
}

// ResignHandler steps the elector down on POST (200 "resigned" once
// OnDemoted ran; 409 when it does not lead; 405 for other methods).
// Handler serves it at /resign only with Options.AllowResign.
func (c *Checker) ResignHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st := c.e.Status()
		serveResign(w, r, st.ReleaseTimeout+st.RenewDeadline, "not the leader", c.e.Resign)
	})
}

// NamedCheck is the Kubernetes-style shape: controller-runtime's
// healthz.Checker is a func(*http.Request) error, and apiserver's
// healthz.HealthChecker has Name() and Check(*http.Request).
type NamedCheck struct {
	name  string
	check func() error
}

// Name returns the check's name.
func (n NamedCheck) Name() string { return n.name }

// Check runs the check.
func (n NamedCheck) Check(*http.Request) error { return n.check() }

// LivenessCheck returns the liveness probe in the Kubernetes-style shape.
func (c *Checker) LivenessCheck() NamedCheck {
	return NamedCheck{name: c.opts.Name + "-live", check: c.Live}
}

// ReadinessCheck returns the readiness probe in the Kubernetes-style shape.
func (c *Checker) ReadinessCheck() NamedCheck {
	return NamedCheck{name: c.opts.Name + "-ready", check: c.Ready}
}

// LiveFunc returns liveness as the plain func(context.Context) error that
// hellofresh/health-go and alexliesenfeld/health take.
func (c *Checker) LiveFunc() func(context.Context) error {
	return func(context.Context) error { return c.Live() }
}

// ReadyFunc returns readiness as a plain func(context.Context) error.
func (c *Checker) ReadyFunc() func(context.Context) error {
	return func(context.Context) error { return c.Ready() }
}
