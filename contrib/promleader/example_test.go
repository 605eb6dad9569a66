package promleader_test

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgleader/pgleader/contrib/promleader"
	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/group"
	"github.com/pgleader/pgleader/leader"
)

// Prometheus metrics for an elector: pass the Metrics as its Observer. One
// Metrics serves every elector of the process.
func Example() {
	metrics, err := promleader.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		panic(err)
	}
	e, err := elector.New(elector.Config{
		Connect:   elector.DSN("postgres://app@db.internal/app"),
		Key:       leader.KeyFromName("reports"),
		Observer:  metrics,
		Callbacks: elector.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) { <-ctx.Done() }},
	})
	fmt.Println(e != nil, err)
	// Output: true <nil>
}

// Metrics for an group.Group: the collector reads the group's Status at
// each scrape, so a group of any size costs a few series.
func ExampleNewGroupCollector() {
	g, err := group.New(group.Config{
		Connect:   leader.DSN("postgres://app@db.internal/app"),
		Group:     "tenant-schedulers",
		Keys:      []leader.Key{leader.KeyFromName("scheduler/acme"), leader.KeyFromName("scheduler/globex")},
		Callbacks: group.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) { <-ctx.Done() }},
	})
	if err != nil {
		panic(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(promleader.NewGroupCollector(g))
	families, err := reg.Gather()
	fmt.Println(len(families), err)
	// Output: 7 <nil>
}
