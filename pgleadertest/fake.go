package pgleadertest

import (
	"context"
	"sync"
	"time"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/leader"
)

// Fake is an elector.Candidate that a unit test drives, with no database:
// Elect, Demote and SetLeader change what it reports, at once. Hand it to
// code that takes an elector.Candidate (health.NewChecker,
// gocronleader.New, your own) to test how that code follows leadership.
type Fake struct {
	mu      sync.Mutex
	st      elector.Status
	elected chan struct{}
	once    sync.Once
	resigns int
	value   leader.Proclamation // see SetLeaderValue
}

var _ elector.Candidate = (*Fake)(nil)

// NewFake returns a follower named identity for key, with the elector's
// default timings in its Status.
func NewFake(identity string, key leader.Key) *Fake {
	return &Fake{elected: make(chan struct{}), st: elector.Status{Identity: identity, Key: key, Connected: true,
		LastRound: time.Now(), RenewInterval: elector.DefaultRenewInterval, RenewDeadline: elector.DefaultRenewDeadline,
		LeaseDuration: elector.DefaultLeaseDuration, ReleaseTimeout: elector.DefaultReleaseTimeout}}
}

// Elect makes the fake the leader: IsLeader is true, Leader is its
// identity, Elected is closed.
func (f *Fake) Elect() {
	f.mu.Lock()
	now := time.Now()
	f.st.Leading, f.st.Tenure, f.st.Leader, f.st.Since, f.st.LastRenew, f.st.LastRound, f.st.LastError =
		true, true, f.st.Identity, now, now, now, ""
	f.mu.Unlock()
	f.once.Do(func() { close(f.elected) })
}

// Demote ends the fake's tenure with reason (nil: a resign): it no longer
// leads, and Status says why.
func (f *Fake) Demote(reason error) {
	if reason == nil {
		reason = leader.ErrResigned
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st.Leading, f.st.Tenure, f.st.Since, f.st.LastRound, f.st.LastError = false, false, time.Time{}, time.Now(), reason.Error()
	if f.st.Leader == f.st.Identity {
		f.st.Leader = ""
	}
}

// SetLeader makes another candidate the leader ("" for none); the fake,
// if it led, is demoted first.
func (f *Fake) SetLeader(identity string) {
	f.mu.Lock()
	leading := f.st.Leading && identity != f.st.Identity
	f.mu.Unlock()
	if leading {
		f.Demote(leader.ErrLockLost)
	}
	f.mu.Lock()
	f.st.Leader, f.st.LastRound = identity, time.Now()
	f.mu.Unlock()
}

// SetLeaderValue makes identity the leader (as SetLeader does) with value
// as its value (elector.Config.Value): what LeaderValue then reports.
func (f *Fake) SetLeaderValue(identity string, value []byte) {
	f.SetLeader(identity)
	f.mu.Lock()
	f.value = leader.Proclamation{Identity: identity, Value: value}
	f.mu.Unlock()
}

// LeaderValue returns the leader and the value SetLeaderValue gave it; the
// value is nil for a leader set otherwise.
func (f *Fake) LeaderValue() leader.Proclamation {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.value.Identity == f.st.Leader {
		return f.value
	}
	return leader.Proclamation{Identity: f.st.Leader}
}

// SetStatus edits the fake's Status (a stalled loop, an old renew, a
// disconnect) for probe tests.
func (f *Fake) SetStatus(edit func(*elector.Status)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	edit(&f.st)
}

// Resigns counts the calls of Resign that found the fake leading.
func (f *Fake) Resigns() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.resigns
}

// Identity implements elector.Candidate.
func (f *Fake) Identity() string { return f.Status().Identity }

// Key implements elector.Candidate.
func (f *Fake) Key() leader.Key { return f.Status().Key }

// IsLeader implements elector.Candidate.
func (f *Fake) IsLeader() bool { return f.Status().Leading }

// Leader implements elector.Candidate.
func (f *Fake) Leader() string { return f.Status().Leader }

// Status implements elector.Candidate.
func (f *Fake) Status() elector.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st
}

// Elected implements elector.Candidate.
func (f *Fake) Elected() <-chan struct{} { return f.elected }

// Resign implements elector.Candidate: a leading fake is demoted with
// leader.ErrResigned; otherwise leader.ErrNotLeader.
func (f *Fake) Resign(context.Context) error {
	f.mu.Lock()
	leading := f.st.Leading
	if leading {
		f.resigns++
	}
	f.mu.Unlock()
	if !leading {
		return leader.ErrNotLeader
	}
	f.Demote(leader.ErrResigned)
	return nil
}
