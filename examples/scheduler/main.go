// Command scheduler runs three replicas of an app, each with an embedded
// gocron scheduler. The job runs every second on exactly one of them: the
// leader. Halfway through, the leader resigns and another one takes over.
//
//	go run ./examples/scheduler
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/pgleader/pgleader/contrib/gocronleader"
	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/leader"
	"github.com/pgleader/pgleader/pgleadertest"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "scheduler:", err)
		os.Exit(1)
	}
}

func run() error {
	dsn, release, err := pgleadertest.Database()
	if err != nil {
		return err
	}
	defer release()
	sigCtx, stopSignals := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM) // a pod gets SIGTERM
	defer stopSignals()
	ctx, cancel := context.WithCancel(sigCtx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }() // after the schedulers shut down
	elected := make(chan *elector.Elector, 4)
	for i := 1; i <= 3; i++ {
		id := fmt.Sprintf("replica-%d", i)
		e, s, err := newReplica(dsn, id, nil, func(ctx context.Context, e *elector.Elector, l leader.Leadership) {
			fmt.Printf("%s is the leader\n", l.Identity)
			elected <- e
		}, func() {
			fmt.Printf("  %s  job run by %s\n", time.Now().Format("15:04:05"), id)
		})
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() { defer wg.Done(); e.Run(ctx) }()
		s.Start()
		defer s.Shutdown()
	}
	first := <-elected
	time.Sleep(3500 * time.Millisecond)
	fmt.Printf("%s resigns\n", first.Identity())
	first.Resign(ctx)
	<-elected
	time.Sleep(3 * time.Second)
	return nil
}

// newReplica builds one replica of the app: an elector and a gocron
// scheduler whose job, firing every second, runs only on the leader.
func newReplica(dsn, id string, tune func(*elector.Config), onElected func(context.Context, *elector.Elector, leader.Leadership), job func()) (*elector.Elector, gocron.Scheduler, error) {
	var e *elector.Elector
	cfg := elector.Config{
		Connect:  elector.DSN(dsn),
		Key:      leader.KeyFromName("examples/scheduler"),
		Identity: id,
		Callbacks: elector.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) {
			onElected(ctx, e, l)
			<-ctx.Done()
		}},
	}
	if tune != nil {
		tune(&cfg)
	}
	e, err := elector.New(cfg)
	if err != nil {
		return nil, nil, err
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedElector(gocronleader.New(e)))
	if err != nil {
		return nil, nil, err
	}
	if _, err := s.NewJob(gocron.CronJob("* * * * * *", true), gocron.NewTask(job)); err != nil {
		return nil, nil, err
	}
	return e, s, nil
}
