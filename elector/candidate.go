package elector

import (
	"context"

	"github.com/pgleader/pgleader/leader"
)

// Candidate is what the code around an elector needs of it: probes
// (health.NewChecker), schedulers (contrib/gocronleader), and a program's
// own code. *Elector implements it; pgleadertest.Fake is one a unit test
// drives without a database. Accept a Candidate where you can, and your
// tests can run leadership changes in microseconds.
type Candidate interface {
	// Identity is this candidate's identity (application_name).
	Identity() string
	// Key is the election's key.
	Key() leader.Key
	// IsLeader reports whether this candidate leads now (within its trust
	// window).
	IsLeader() bool
	// Leader is the current leader's identity as last seen ("" when nobody
	// leads, or unknown).
	Leader() string
	// LeaderValue is the current leader with the value it proclaimed
	// (Config.Value; nil until known, and with values off).
	LeaderValue() leader.Proclamation
	// Status is a snapshot for probes and status pages.
	Status() Status
	// Elected is closed once this candidate is first elected.
	Elected() <-chan struct{}
	// Resign hands leadership over; leader.ErrNotLeader when it does not
	// lead.
	Resign(ctx context.Context) error
}

var _ Candidate = (*Elector)(nil)
