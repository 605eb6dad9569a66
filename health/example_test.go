package health_test

import (
	"context"
	"fmt"
	"net/http"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/group"
	"github.com/pgleader/pgleader/health"
	"github.com/pgleader/pgleader/leader"
)

func newElector(obs leader.Observer) *elector.Elector {
	e, err := elector.New(elector.Config{
		Connect:   leader.DSN("postgres://app@db.internal/app"),
		Key:       leader.KeyFromName("reports"),
		Identity:  "reports-7f9c",
		Observer:  obs,
		Callbacks: elector.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) { <-ctx.Done() }},
	})
	if err != nil {
		panic(err)
	}
	return e
}

// Probes for an active/passive replica: only the leader is ready, so a
// Kubernetes Service routes traffic to it alone (see docs/kubernetes.md
// for what that needs from the rollout). Metrics come from the
// contrib/promleader module.
func Example() {
	e := newElector(nil)
	checker := health.NewChecker(e, health.Options{LeaderOnly: true})
	http.Handle("/livez", checker.LivezHandler())
	http.Handle("/readyz", checker.ReadyzHandler())
	http.Handle("/status", checker.StatusHandler())
	// go e.Run(ctx); http.ListenAndServe(":8080", nil)
	fmt.Println(checker.Live())
	fmt.Println(checker.Ready())
	// Output:
	// <nil>
	// health: not ready: not the leader
}

// The Kubernetes-style shape: Name() and Check(*http.Request), as
// apiserver's healthz.HealthChecker; Check itself is a controller-runtime
// healthz.Checker (mgr.AddReadyzCheck(c.Name(), c.Check)).
func ExampleChecker_ReadinessCheck() {
	checker := health.NewChecker(newElector(nil), health.Options{LeaderOnly: true})
	c := checker.ReadinessCheck()
	var named interface {
		Name() string
		Check(*http.Request) error
	} = c
	fmt.Println(named.Name(), named.Check(nil))
	// Output: pgleader-ready health: not ready: not the leader
}

// The plain func(context.Context) error that hellofresh/health-go
// (health.Config{Check: ...}) and alexliesenfeld/health
// (health.Check{Check: ...}) take.
func ExampleChecker_LiveFunc() {
	checker := health.NewChecker(newElector(nil), health.Options{})
	check := checker.LiveFunc()
	fmt.Println(check(context.Background()))
	// Output: <nil>
}

// Probes for a member of a group.Group: alive while its loop runs,
// ready always (every member serves), and POST /resign?key=NAME to hand
// one key over.
func ExampleNewGroupChecker() {
	g, err := group.New(group.Config{
		Connect:   leader.DSN("postgres://app@db.internal/app"),
		Group:     "tenant-schedulers",
		Keys:      []leader.Key{leader.KeyFromName("scheduler/acme"), leader.KeyFromName("scheduler/globex")},
		Identity:  "scheduler-7f9c",
		Callbacks: group.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) { <-ctx.Done() }},
	})
	if err != nil {
		panic(err)
	}
	checker := health.NewGroupChecker(g, health.Options{AllowResign: true})
	http.Handle("/", checker.Handler()) // /livez, /readyz, /status, /resign
	// go g.Run(ctx); http.ListenAndServe(":8080", nil)
	fmt.Println(checker.Live(), checker.Ready(), checker.Snapshot().Keys)
	// Output:
	// <nil> <nil> 2
}
