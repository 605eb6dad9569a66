// Package gocronleader makes a pgleader Elector the distributed elector of a
// go-co-op/gocron v2 scheduler, so that with one scheduler embedded in every
// replica each job runs on the leader only.
//
//	e, _ := elector.New(elector.Config{...})
//	go e.Run(ctx)
//	s, _ := gocron.NewScheduler(gocron.WithDistributedElector(gocronleader.New(e)))
//
// # Why an Elector and not a Locker
//
// gocron also takes a Locker (WithDistributedLocker), which locks each job
// run by name. That breaks when the replicas' timers are offset (gocron
// issue #841): a replica whose tick comes after another replica's run has
// already finished and unlocked takes the lock again and runs the same tick
// twice. Keying the lock per tick would need the tick's scheduled time,
// which the Locker interface does not pass (only the job name). An
// election has no such gap: only the leader's scheduler runs jobs at all,
// whatever the offsets. A job that must not run twice even across a
// failover should also fence its writes with the Leadership's term.
package gocronleader

import (
	"context"
	"errors"

	"github.com/go-co-op/gocron/v2"

	"github.com/pgleader/pgleader/elector"
)

// ErrNotLeader is returned by IsLeader on a follower; gocron then skips the
// job run.
var ErrNotLeader = errors.New("gocronleader: this replica is not the leader")

// Elector adapts an elector.Candidate (an *elector.Elector, or
// pgleadertest.Fake in a unit test) to gocron.Elector.
type Elector struct{ e elector.Candidate }

var _ gocron.Elector = Elector{}

// New wraps e. Run e yourself (go e.Run(ctx)).
func New(e elector.Candidate) Elector { return Elector{e: e} }

// IsLeader returns nil while this replica leads. It reads the elector's
// cached state and never blocks or queries: gocron calls it for every run
// of every job.
func (g Elector) IsLeader(context.Context) error {
	if g.e.IsLeader() {
		return nil
	}
	return ErrNotLeader
}
