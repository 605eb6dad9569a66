package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/leader"
)

// proclaim measures how soon a leader's value reaches those who follow it:
// 3 electors with values on one key, and `observers` ObserveValues
// watchers; per run the leader proclaims a new value, and each watcher's
// and each follower's delay from the Proclaim call to its report of that
// value is taken; then the leader resigns, and each watcher's delay from
// the new leader's OnElected to its report of the new leader's own value
// (the announcement, then the value written right after it) is taken
// alongside, as the bound to compare with.
func (b *bencher) proclaim(observers, runs int) error {
	key := leader.KeyFromName(b.name("proclaim"))
	table := "bench_values"
	type seen struct {
		who string
		p   leader.Proclamation
		at  time.Time
	}
	heard := make(chan seen, 64*(observers+3))
	elected := make(chan seen, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, observers+3)
	els := map[string]*elector.Elector{}
	for i := range 3 {
		id := fmt.Sprintf("proclaim-%d", i)
		e, err := elector.New(elector.Config{
			Connect: elector.DSN(b.dsn), Key: key, Identity: id, Value: []byte(id + "/0"), Values: elector.Values{Table: table},
			Callbacks: elector.Callbacks{
				OnElected: func(ctx context.Context, l leader.Leadership) {
					elected <- seen{who: id, at: time.Now()}
					<-ctx.Done()
				},
				OnLeaderValue: func(p leader.Proclamation) {
					if p.Identity != id {
						heard <- seen{id, p, time.Now()}
					}
				},
			},
		})
		if err != nil {
			cancel()
			return err
		}
		els[id] = e
		go func() { e.Run(ctx); done <- struct{}{} }()
	}
	for i := range observers {
		who := fmt.Sprintf("observer-%d", i)
		go func() {
			elector.ObserveValues(ctx, elector.DSN(b.dsn), key, elector.Values{Table: table}, func(p leader.Proclamation) {
				heard <- seen{who, p, time.Now()}
			})
			done <- struct{}{}
		}()
	}
	defer func() {
		cancel()
		for range observers + 3 {
			<-done
		}
	}()
	if err := waitStanding(ctx, b.admin, key, 3); err != nil {
		return err
	}
	// waitAll waits until every one of the observers (and, unless
	// observersOnly, the 2 followers) reported want, and returns the
	// observers' and the followers' delays from since.
	waitAll := func(want leader.Proclamation, observersOnly bool, since time.Time) (obs, fol []float64, err error) {
		n := observers
		if !observersOnly {
			n += 2
		}
		got := map[string]bool{}
		deadline := time.After(time.Minute)
		for len(got) < n {
			select {
			case h := <-heard:
				isObs := h.who[0] == 'o'
				if observersOnly && !isObs || got[h.who] || h.p.Identity != want.Identity || string(h.p.Value) != string(want.Value) {
					continue
				}
				got[h.who] = true
				d := float64(h.at.Sub(since).Microseconds()) / 1000
				if isObs {
					obs = append(obs, d)
				} else {
					fol = append(fol, d)
				}
			case <-deadline:
				return nil, nil, fmt.Errorf("only %d of %d heard %s=%q within a minute", len(got), n, want.Identity, want.Value)
			}
		}
		return obs, fol, nil
	}
	cur := <-elected
	if _, _, err := waitAll(leader.Proclamation{Identity: cur.who, Value: []byte(cur.who + "/0")}, false, cur.at); err != nil {
		return err
	}
	last := map[string][]byte{}
	for id := range els {
		last[id] = []byte(id + "/0")
	}
	var toObservers, toFollowers, electedDelays []float64
	for run := 1; run <= runs; run++ {
		want := leader.Proclamation{Identity: cur.who, Value: fmt.Appendf(nil, "%s/%d", cur.who, run)}
		began := time.Now()
		if err := els[cur.who].Proclaim(ctx, want.Value); err != nil {
			return fmt.Errorf("proclaim: %w", err)
		}
		last[cur.who] = want.Value
		obs, fol, err := waitAll(want, false, began)
		if err != nil {
			return err
		}
		toObservers, toFollowers = append(toObservers, obs...), append(toFollowers, fol...)
		if err := els[cur.who].Resign(ctx); err != nil {
			return err
		}
		select {
		case cur = <-elected:
		case <-time.After(time.Minute):
			return errors.New("no election within a minute of a resign")
		}
		// The new leader's value is what it last proclaimed, or its first.
		obs, _, err = waitAll(leader.Proclamation{Identity: cur.who, Value: last[cur.who]}, true, cur.at)
		if err != nil {
			return err
		}
		electedDelays = append(electedDelays, obs...)
	}
	b.add("proclaim", fmt.Sprintf("Proclaim call to every watcher's report of the value (%d ObserveValues watchers)", observers), "ms", "p99 <= the next line's", toObservers)
	b.add("proclaim", fmt.Sprintf("new leader's OnElected to every watcher's report of its value (%d watchers)", observers), "ms", "", electedDelays)
	b.add("proclaim", "Proclaim call to each follower's OnLeaderValue (2 heirs: after their lock wait)", "ms", "p99 <= 2000", toFollowers)
	return nil
}
