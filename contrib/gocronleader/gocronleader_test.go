package gocronleader_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"go.uber.org/goleak"

	"github.com/pgleader/pgleader/contrib/gocronleader"
	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/leader"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Three replicas, each with an elector and a gocron scheduler firing every
// second: every tick's job runs exactly once across them, through a
// leadership change.
func TestEachTickRunsOnce(t *testing.T) {
	srv := testpg.Start(t)
	key := leader.KeyFromName(t.Name())
	var mu sync.Mutex
	runs := map[int64][]string{} // tick (unix second) -> replicas that ran it
	elected := make(chan string, 16)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	els := map[string]*elector.Elector{}
	var scheds []gocron.Scheduler
	for i := 0; i < 3; i++ {
		id := fmt.Sprintf("replica-%d", i)
		e, err := elector.New(elector.Config{
			Connect: elector.DSN(srv.DSN()), Key: key, Identity: id,
			RenewInterval: 100 * time.Millisecond, RenewDeadline: 500 * time.Millisecond, LeaseDuration: 1500 * time.Millisecond,
			Callbacks: elector.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) { elected <- id; <-ctx.Done() }},
		})
		if err != nil {
			t.Fatal(err)
		}
		els[id] = e
		wg.Add(1)
		go func() { defer wg.Done(); e.Run(ctx) }()
		s, err := gocron.NewScheduler(gocron.WithDistributedElector(gocronleader.New(e)))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.NewJob(gocron.CronJob("* * * * * *", true), gocron.NewTask(func() {
			tick := time.Now().Add(100 * time.Millisecond).Truncate(time.Second).Unix() // up to 0.9 s late
			mu.Lock()
			runs[tick] = append(runs[tick], id)
			mu.Unlock()
		})); err != nil {
			t.Fatal(err)
		}
		s.Start()
		scheds = append(scheds, s)
	}
	defer func() {
		for _, s := range scheds {
			s.Shutdown()
		}
		cancel()
		wg.Wait()
	}()
	var first string
	select {
	case first = <-elected:
	case <-time.After(30 * time.Second):
		t.Fatal("no first leader within 30s")
	}
	time.Sleep(2500 * time.Millisecond) // ticks under the first leader
	// Hand over in the middle of a second, away from the ticks.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(1500 * time.Millisecond)))
	if err := els[first].Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	var second string
	select {
	case second = <-elected:
	case <-time.After(30 * time.Second):
		t.Fatal("no second leader within 30s")
	}
	time.Sleep(2500 * time.Millisecond) // ticks under the second leader
	mu.Lock()
	defer mu.Unlock()
	ticks, leaders := 0, map[string]bool{}
	for tick, who := range runs {
		if len(who) != 1 {
			t.Errorf("tick %d ran %d times: %v", tick, len(who), who)
		}
		ticks++
		leaders[who[0]] = true
	}
	if ticks < 4 || !leaders[first] || !leaders[second] {
		t.Fatalf("%d ticks run by %v; want at least 4, by %s and %s", ticks, leaders, first, second)
	}
}
