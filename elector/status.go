package elector

import (
	"time"

	"github.com/pgleader/pgleader/leader"
)

// Status is a snapshot of an elector's state, for probes and status pages.
type Status struct {
	// Identity and Key are the elector's own.
	Identity string
	Key      leader.Key
	// Leading is IsLeader(): the lock is held and the trust window is open.
	Leading bool
	// Tenure is true from the election until the demotion begins, even when
	// the trust window has passed: a leader that believes it leads.
	Tenure bool
	// Leader is Leader(): the current leader's identity as last seen.
	Leader string
	// Term is the current tenure's fencing term (0 without fencing or when
	// not leading).
	Term int64
	// Since is when the current tenure began (zero when not leading).
	Since time.Time
	// Connected reports whether the elector has a working session.
	Connected bool
	// LastRenew is when the last successful renew (or the election) was
	// sent; zero before the first election.
	LastRenew time.Time
	// LastRound is when the elector last finished a step of its loop: a
	// campaign round, a renew, or a connection attempt. Liveness probes
	// watch it.
	LastRound time.Time
	// LastError is the last connection error or demotion reason ("" when
	// none since the last success).
	LastError string
	// RequestsDropped counts the resign requests (RequestResign, pgleader
	// resign) this elector dropped unread, or refused without a log line:
	// a flood of them (NOTIFY is not authenticated), beyond 5 a second or
	// again from an asker refused in the last 10 seconds.
	RequestsDropped int64
	// RenewInterval, RenewDeadline, LeaseDuration and ReleaseTimeout are
	// the elector's settings, for probes.
	RenewInterval, RenewDeadline, LeaseDuration, ReleaseTimeout time.Duration
	// Priority, Version and Strategy are the elector's rank (Config).
	Priority int
	Version  string
	Strategy leader.Strategy
	// Candidates are, while this elector leads, the ranks candidates told
	// it (ranked candidates only; one that ranks above the leader is
	// proven as it arrives, and dropped when the proof fails; the others
	// are claims until the leader hands over to one), and Why says why it
	// leads: "first come" (no
	// candidate it heard of ranks above or below it), "preferred (...)"
	// (it ranks above every one), or "handing over to a preferred
	// candidate (...)". Both are empty while it follows.
	Candidates []RankedCandidate
	Why        string
}

// RankedCandidate is a rank a candidate told the leader: its backend pid, its
// priority and version, and when the rank reached the leader.
type RankedCandidate struct {
	PID      uint32
	Priority int
	Version  string
	Since    time.Time
}

// Status returns a snapshot of the elector's state.
func (e *Elector) Status() Status {
	e.mu.Lock()
	st := e.st
	e.mu.Unlock()
	st.Leading = e.IsLeader()
	st.Tenure = e.leading.Load()
	st.Leader = e.Leader()
	st.RequestsDropped = e.requests.total()
	if !st.Tenure {
		st.Term, st.Since, st.Candidates, st.Why = 0, time.Time{}, nil, ""
	}
	st.Candidates = append([]RankedCandidate(nil), st.Candidates...)
	return st
}

// note updates the status under the lock.
func (e *Elector) note(f func(st *Status)) {
	e.mu.Lock()
	f(&e.st)
	e.mu.Unlock()
}
