package health

import (
	"errors"
	"testing"
	"time"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/group"
)

// The liveness rule over synthetic statuses and a fixed clock, at every
// boundary, as client-go tests its adaptor: a wedged leader and a stalled
// loop fail; followers, an outage and a leader within its window pass.
func TestLiveRule(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	const (
		deadline  = 3 * time.Second
		tolerance = 2 * time.Second
		stall     = 17 * time.Second
	)
	c := &Checker{opts: Options{Tolerance: tolerance, StallTimeout: stall}, now: func() time.Time { return now }}
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	base := elector.Status{RenewDeadline: deadline, LastRound: ago(time.Second)}
	tests := []struct {
		name string
		edit func(st *elector.Status)
		live bool
	}{
		{"follower, recent round", func(st *elector.Status) {}, true},
		{"follower with an old renew from a past tenure", func(st *elector.Status) { st.LastRenew = ago(time.Hour) }, true},
		{"leader, renewed just now", func(st *elector.Status) { st.Tenure, st.LastRenew = true, ago(0) }, true},
		{"leader, renew exactly at deadline+tolerance", func(st *elector.Status) { st.Tenure, st.LastRenew = true, ago(deadline+tolerance) }, true},
		{"leader, renew just past deadline+tolerance: wedged", func(st *elector.Status) {
			st.Tenure, st.LastRenew = true, ago(deadline+tolerance+time.Millisecond)
		}, false},
		{"leader without a renew time yet", func(st *elector.Status) { st.Tenure = true }, true},
		{"loop finished a step exactly StallTimeout ago", func(st *elector.Status) { st.LastRound = ago(stall) }, true},
		{"loop stalled just past StallTimeout", func(st *elector.Status) { st.LastRound = ago(stall + time.Millisecond) }, false},
		{"outage: disconnected, but attempts keep finishing", func(st *elector.Status) {
			st.Connected, st.LastError, st.LastRound = false, "connect: refused", ago(100*time.Millisecond)
		}, true},
		{"on a standby: retried, live", func(st *elector.Status) { st.LastError = "session setup: standby" }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := base
			tt.edit(&st)
			err := c.live(st)
			if (err == nil) != tt.live {
				t.Fatalf("live = %v (%v), want %v", err == nil, err, tt.live)
			}
			if err != nil && !errors.Is(err, ErrNotLive) {
				t.Fatalf("error %v does not match ErrNotLive", err)
			}
		})
	}
}

// The group's liveness rule, over synthetic statuses and a fixed clock at
// every boundary: a member that believes it leads keys but has had no full
// round for the trust window plus the tolerance is wedged; a stalled loop
// fails; a member that leads nothing is alive whatever its last round (an
// outage must not restart the fleet).
func TestGroupLiveRule(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	const (
		deadline  = 3 * time.Second
		tolerance = 2 * time.Second
		stall     = 17 * time.Second
	)
	c := &GroupChecker{opts: Options{Tolerance: tolerance, StallTimeout: stall}, now: func() time.Time { return now }}
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	base := group.Status{Group: "g", RenewDeadline: deadline, LastRound: ago(time.Second), LastStep: ago(time.Second)}
	for _, tt := range []struct {
		name string
		edit func(st *group.Status)
		live bool
	}{
		{"leading, a round just now", func(st *group.Status) { st.Tenures, st.LastRound = 4, ago(0) }, true},
		{"leading, last round exactly deadline+tolerance ago", func(st *group.Status) { st.Tenures, st.LastRound = 4, ago(deadline+tolerance) }, true},
		{"leading, last round past deadline but within the tolerance", func(st *group.Status) { st.Tenures, st.LastRound = 4, ago(deadline+tolerance/2) }, true},
		{"leading, last round just past deadline+tolerance: wedged", func(st *group.Status) {
			st.Tenures, st.LastRound = 4, ago(deadline+tolerance+time.Millisecond)
		}, false},
		{"leading nothing, last round long ago (an outage)", func(st *group.Status) { st.Tenures, st.LastRound = 0, ago(time.Hour) }, true},
		{"no round yet", func(st *group.Status) { st.Tenures, st.LastRound = 3, time.Time{} }, true},
		{"loop finished a step exactly StallTimeout ago", func(st *group.Status) { st.LastStep = ago(stall) }, true},
		{"loop stalled just past StallTimeout", func(st *group.Status) { st.LastStep = ago(stall + time.Millisecond) }, false},
		{"loop stalled, leading nothing", func(st *group.Status) { st.Tenures, st.LastStep = 0, ago(time.Hour) }, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st := base
			tt.edit(&st)
			err := c.live(st)
			if (err == nil) != tt.live {
				t.Fatalf("live = %v (%v), want %v", err == nil, err, tt.live)
			}
			if err != nil && !errors.Is(err, ErrNotLive) {
				t.Fatalf("error %v does not match ErrNotLive", err)
			}
		})
	}
}
