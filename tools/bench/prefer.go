package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/leader"
)

// preferDelay is the scenario's PreferredDelay.
const preferDelay = 200 * time.Millisecond

// prefer measures a preference handover (docs/rolling-upgrades.md): per
// run, a leader of version 1.0.0 leads with a 1.0.0 heir standing, and a
// 2.0.0 candidate starts (NewestVersion). The leader's Status shows when
// the candidate's rank reached it; the handover's own time is from then
// to the candidate's OnElected, less PreferredDelay (target: p99 <= 5 ms).
// The electors run in this process, with the bench's timings.
func (b *bencher) prefer(runs int) error {
	key := leader.KeyFromName(b.name("prefer"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type elected struct {
		who string
		at  time.Time
	}
	ch := make(chan elected, 16)
	start := func(id, version string) (*elector.Elector, func(), error) {
		e, err := elector.New(elector.Config{
			Connect: elector.DSN(b.dsn), Key: key, Identity: id, Version: version, Strategy: leader.NewestVersion,
			RenewInterval: b.interval, RenewDeadline: b.deadline, LeaseDuration: b.lease, PreferredDelay: preferDelay,
			Callbacks: elector.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) {
				ch <- elected{id, time.Now()}
				<-ctx.Done()
			}},
		})
		if err != nil {
			return nil, nil, err
		}
		rctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { e.Run(rctx); close(done) }()
		return e, func() { stop(); <-done }, nil
	}
	wait := func(who string) (time.Time, error) {
		deadline := time.After(time.Minute)
		for {
			select {
			case el := <-ch:
				if el.who == who {
					return el.at, nil
				}
			case <-deadline:
				return time.Time{}, fmt.Errorf("%s not elected within a minute", who)
			}
		}
	}
	var own, total []float64
	for run := range runs {
		old, stopOld, err := start(fmt.Sprintf("prefer-old-%d", run), "1.0.0")
		if err != nil {
			return err
		}
		if _, err := wait(fmt.Sprintf("prefer-old-%d", run)); err != nil {
			return err
		}
		_, stopHeir, err := start(fmt.Sprintf("prefer-heir-%d", run), "1.0.0")
		if err != nil {
			return err
		}
		if err := waitStanding(ctx, b.admin, key, 2); err != nil {
			return err
		}
		began := time.Now()
		newID := fmt.Sprintf("prefer-new-%d", run)
		_, stopNew, err := start(newID, "2.0.0")
		if err != nil {
			return err
		}
		var since time.Time
		for since.IsZero() {
			for _, c := range old.Status().Candidates {
				if c.Version == "2.0.0" {
					since = c.Since
				}
			}
			if since.IsZero() {
				if time.Since(began) > time.Minute {
					return errors.New("the leader heard no rank from the new candidate within a minute")
				}
				time.Sleep(time.Millisecond)
			}
		}
		at, err := wait(newID)
		if err != nil {
			return err
		}
		own = append(own, float64(at.Sub(since)-preferDelay)/float64(time.Millisecond))
		total = append(total, float64(at.Sub(began))/float64(time.Millisecond))
		stopOld()
		stopHeir()
		stopNew()
	}
	b.add("prefer", fmt.Sprintf("rank reached the leader to the preferred candidate's OnElected, less PreferredDelay (%s)", preferDelay), "ms", "p99 <= 5", own)
	b.add("prefer", "the preferred candidate's start to its OnElected (connect, rank, PreferredDelay, handover)", "ms", "", total)
	return nil
}
