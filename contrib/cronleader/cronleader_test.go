package cronleader_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/robfig/cron/v3"
	"go.uber.org/goleak"

	"github.com/pgleader/pgleader/contrib/cronleader"
	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/leader"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Two replicas with the same cron schedule: only the leader's runs happen.
func TestOnlyLeader(t *testing.T) {
	srv := testpg.Start(t)
	key := leader.KeyFromName(t.Name())
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	elected := make(chan string, 4)
	runs := map[string]*atomic.Int32{"a": {}, "b": {}}
	var crons []*cron.Cron
	for _, id := range []string{"a", "b"} {
		e, err := elector.New(elector.Config{
			Connect: elector.DSN(srv.DSN()), Key: key, Identity: id,
			Callbacks: elector.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) { elected <- id; <-ctx.Done() }},
		})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); e.Run(ctx) }()
		c := cron.New(cron.WithSeconds(), cron.WithChain(cronleader.OnlyLeader(e)))
		c.AddFunc("* * * * * *", func() { runs[id].Add(1) })
		c.Start()
		crons = append(crons, c)
	}
	defer func() {
		for _, c := range crons {
			<-c.Stop().Done()
		}
		cancel()
		wg.Wait()
	}()
	var lead string
	select {
	case lead = <-elected:
	case <-time.After(30 * time.Second):
		t.Fatal("no leader within 30s")
	}
	follower := map[string]string{"a": "b", "b": "a"}[lead]
	deadline := time.Now().Add(30 * time.Second)
	for runs[lead].Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the leader's job did not run")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := runs[follower].Load(); n != 0 {
		t.Fatalf("the follower ran the job %d times", n)
	}
}
