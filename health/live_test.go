package health

import (
	"errors"
	"testing"
	"time"

	"github.com/pgleader/pgleader/elector"
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
