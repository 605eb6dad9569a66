package elector_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/leader"
)

// exampleDSN stands for your DATABASE_URL; here it is the tests' throwaway
// server.
func exampleDSN() string {
	srv, err := shared.Start()
	if err != nil {
		panic(err)
	}
	return srv.DSN()
}

// An elector runs a callback while it holds the lock, and hands over on
// Resign.
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	elected := make(chan struct{})
	e, err := elector.New(elector.Config{
		Connect:  elector.DSN(exampleDSN()),
		Key:      leader.KeyFromName("example-job"),
		Identity: "worker-1",
		Callbacks: elector.Callbacks{
			OnElected: func(ctx context.Context, l leader.Leadership) {
				fmt.Println("elected:", l.Identity)
				close(elected)
				<-ctx.Done() // lead until leadership is in doubt
			},
			OnDemoted: func(l leader.Leadership, reason error) {
				fmt.Println("demoted:", reason)
			},
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	<-elected
	fmt.Println("leader:", e.Leader(), e.IsLeader())
	e.Resign(ctx)
	cancel()
	<-done
	// Output:
	// elected: worker-1
	// leader: worker-1 true
	// demoted: pgleader: resigned
}

// New names the field and the rule when a config is wrong.
func ExampleNew_invalidConfig() {
	_, err := elector.New(elector.Config{
		Connect:       elector.DSN("postgres://app:secret@db.internal/app"),
		Key:           leader.KeyFromName("reports"),
		Callbacks:     elector.Callbacks{OnElected: func(context.Context, leader.Leadership) {}},
		RenewInterval: 2 * time.Second,
		RenewDeadline: time.Second,
	})
	fmt.Println(err)
	// Output: pgleader: invalid config: RenewDeadline: must be greater than RenewInterval (2s), got 1s
}

// A main that must not go on before it leads (etcd's Campaign,
// controller-runtime's Elected): run the elector, then wait on Elected.
func ExampleElector_Elected() {
	ctx, cancel := context.WithCancel(context.Background())
	e, err := elector.New(elector.Config{
		Connect:  elector.DSN(exampleDSN()),
		Key:      leader.KeyFromName("example-elected"),
		Identity: "main-1",
		Callbacks: elector.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) {
			<-ctx.Done() // the work that needs leadership
		}},
	})
	if err != nil {
		panic(err)
	}
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	<-e.Elected()
	fmt.Println("leading:", e.IsLeader())
	cancel()
	<-done
	// Output: leading: true
}

// A process that does not campaign (a dashboard, a router) watches who
// leads: Observe reports the leader now and at every change.
func ExampleObserve() {
	ctx, cancel := context.WithCancel(context.Background())
	key := leader.KeyFromName("example-observe")
	seen := make(chan string, 8)
	done := make(chan error, 1)
	go func() {
		done <- elector.Observe(ctx, elector.DSN(exampleDSN()), key, func(identity string) { seen <- identity })
	}()
	fmt.Printf("leader: %q\n", <-seen)
	cancel()
	<-done
	// Output: leader: ""
}

// RequestResign asks a key's leader, wherever it runs, to hand over; here
// to the candidate named "worker-b".
func ExampleRequestResign() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dsn := exampleDSN()
	key := leader.KeyFromName("example-handover")
	elected := make(chan string, 2)
	done := make(chan struct{}, 2)
	start := func(id string) {
		e, _ := elector.New(elector.Config{
			Connect: elector.DSN(dsn), Key: key, Identity: id,
			Callbacks: elector.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) {
				elected <- l.Identity
				<-ctx.Done()
			}},
		})
		go func() { e.Run(ctx); done <- struct{}{} }()
	}
	start("worker-a")
	fmt.Println("elected:", <-elected)
	start("worker-b")
	// Wait until worker-b stands by (its first poll), then ask.
	for {
		ho, err := elector.RequestResign(ctx, elector.DSN(dsn), key, "worker-b")
		if errors.Is(err, leader.ErrNotCandidate) {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println("handed over:", ho.From, "->", ho.To)
		break
	}
	fmt.Println("elected:", <-elected)
	cancel()
	<-done
	<-done
	// Output:
	// elected: worker-a
	// handed over: worker-a -> worker-b
	// elected: worker-b
}

// A semaphore of 2 slots: three candidates, two lead, each in a slot of
// its own; the third takes the slot the first resigns.
func ExampleNewSemaphore() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	leading := map[string]bool{}
	changed := make(chan struct{}, 16)
	var sems []*elector.Semaphore
	for _, id := range []string{"backfill-a", "backfill-b", "backfill-c"} {
		s, err := elector.NewSemaphore(elector.Config{
			Connect:  elector.DSN(exampleDSN()),
			Key:      leader.KeyFromName("example-backfill"),
			Identity: id,
			Callbacks: elector.Callbacks{
				OnElected: func(ctx context.Context, l leader.Leadership) {
					mu.Lock()
					leading[id] = true
					mu.Unlock()
					changed <- struct{}{}
					<-ctx.Done()
					mu.Lock()
					delete(leading, id)
					mu.Unlock()
				},
			},
		}, 2)
		if err != nil {
			fmt.Println(err)
			return
		}
		sems = append(sems, s)
	}
	// Start a and b, and c once both lead: c waits for a slot.
	done := make(chan error, 3)
	go func() { done <- sems[0].Run(ctx) }()
	<-changed
	go func() { done <- sems[1].Run(ctx) }()
	<-changed
	go func() { done <- sems[2].Run(ctx) }()
	slot, _ := sems[0].Slot()
	other, _ := sems[1].Slot()
	fmt.Println("a and b lead slots", slot+other == 1)
	sems[0].Resign(ctx)
	<-changed
	mu.Lock()
	fmt.Println("leading:", leading["backfill-b"], leading["backfill-c"], len(leading))
	mu.Unlock()
	cancel()
	for range 3 {
		<-done
	}
	// Output:
	// a and b lead slots true
	// leading: true true 2
}

// A leader's value: each replica proclaims its address as it is elected,
// so that others can route to the leader; ObserveValues follows the leader
// and its value without campaigning, and Proclaim changes the value with
// no new election.
func ExampleElector_Proclaim() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	key := leader.KeyFromName("example-value")
	seen := make(chan leader.Proclamation, 16)
	observed := make(chan error, 1)
	go func() {
		observed <- elector.ObserveValues(ctx, elector.DSN(exampleDSN()), key, elector.Values{}, func(p leader.Proclamation) {
			if p.Value != nil {
				seen <- p
			}
		})
	}()
	e, err := elector.New(elector.Config{
		Connect:   elector.DSN(exampleDSN()),
		Key:       key,
		Identity:  "web-1",
		Value:     []byte("http://10.0.0.1:8080"),
		Callbacks: elector.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) { <-ctx.Done() }},
	})
	if err != nil {
		panic(err)
	}
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	p := <-seen
	fmt.Printf("%s at %s\n", p.Identity, p.Value)
	if err := e.Proclaim(ctx, []byte("http://10.0.0.1:9090")); err != nil {
		panic(err)
	}
	p = <-seen
	fmt.Printf("%s at %s\n", p.Identity, p.Value)
	cancel()
	<-done
	<-observed
	// Output:
	// web-1 at http://10.0.0.1:8080
	// web-1 at http://10.0.0.1:9090
}

// A rollout under NewestVersion: the leader of version 1.0.0 hands over to
// the first 2.0.0 candidate that stands, after PreferredDelay, gracefully
// (its OnElected returns before the unlock). See docs/rolling-upgrades.md.
func ExampleConfig_newestVersion() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	elected := make(chan string, 4)
	demoted := make(chan error, 4)
	run := func(id, version string) chan error {
		e, err := elector.New(elector.Config{
			Connect:  elector.DSN(exampleDSN()),
			Key:      leader.KeyFromName("example-rollout"),
			Identity: id,
			Version:  version,
			Strategy: leader.NewestVersion,
			Callbacks: elector.Callbacks{
				OnElected: func(ctx context.Context, l leader.Leadership) {
					elected <- l.Identity
					<-ctx.Done()
				},
				OnDemoted: func(l leader.Leadership, reason error) { demoted <- reason },
			},
		})
		if err != nil {
			panic(err)
		}
		done := make(chan error, 1)
		go func() { done <- e.Run(ctx) }()
		return done
	}
	old := run("app-v1", "1.0.0")
	fmt.Println("elected:", <-elected)
	next := run("app-v2", "2.0.0")
	fmt.Println("elected:", <-elected)
	fmt.Println("demoted:", <-demoted)
	cancel()
	<-old
	<-next
	// Output:
	// elected: app-v1
	// elected: app-v2
	// demoted: pgleader: resigned: handover to preferred candidate app-v2 (NewestVersion: version "2.0.0" over "1.0.0")
}
