package promleader_test

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgleader/pgleader/contrib/promleader"
	"github.com/pgleader/pgleader/elector"
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
