package group_test

import (
	"context"
	"fmt"
	"time"

	"github.com/pgleader/pgleader/group"
	"github.com/pgleader/pgleader/leader"
)

// A Group leads many keys on one connection and spreads them over its
// members; here two members share four tenants' schedulers.
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dsn := exampleDSN()
	var keys []leader.Key
	for _, tenant := range []string{"acme", "globex", "initech", "umbrella"} {
		keys = append(keys, leader.KeyFromName("scheduler/"+tenant))
	}
	var groups []*group.Group
	done := make(chan struct{}, 2)
	for _, id := range []string{"replica-a", "replica-b"} {
		g, err := group.New(group.Config{
			Connect: leader.DSN(dsn), Group: "example-schedulers", Keys: keys, Identity: id,
			Callbacks: group.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) {
				<-ctx.Done() // run this tenant's scheduler until handed over
			}},
		})
		if err != nil {
			fmt.Println(err)
			return
		}
		groups = append(groups, g)
		go func() { g.Run(ctx); done <- struct{}{} }()
	}
	balanced := func() bool { return len(groups[0].Owned()) == 2 && len(groups[1].Owned()) == 2 }
	for deadline := time.Now().Add(time.Minute); !balanced() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond) // in a real program: Status, or a health probe
	}
	fmt.Println("each replica leads", len(groups[0].Owned()), "of", len(keys), "tenants")
	cancel()
	<-done
	<-done
	// Output:
	// each replica leads 2 of 4 tenants
}

// exampleDSN stands for your DATABASE_URL; here it is the tests' throwaway
// server.
func exampleDSN() string {
	srv, err := shared.Start()
	if err != nil {
		panic(err)
	}
	return srv.DSN()
}
