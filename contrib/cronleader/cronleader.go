// Package cronleader runs robfig/cron v3 jobs on the elected replica only.
//
//	c := cron.New(cron.WithChain(cronleader.OnlyLeader(e)))
//
// Every replica keeps the same schedule; on a follower each run is skipped.
package cronleader

import (
	"github.com/robfig/cron/v3"

	"github.com/pgleader/pgleader/elector"
)

// Leader is what OnlyLeader asks; *elector.Elector satisfies it.
type Leader interface{ IsLeader() bool }

var _ Leader = (*elector.Elector)(nil)

// OnlyLeader is a cron.JobWrapper that runs a job only while l leads (a
// cached check, no query). Pass a logger-aware wrapper such as
// cron.SkipIfStillRunning alongside it as usual.
func OnlyLeader(l Leader) cron.JobWrapper {
	return func(j cron.Job) cron.Job {
		return cron.FuncJob(func() {
			if l.IsLeader() {
				j.Run()
			}
		})
	}
}
