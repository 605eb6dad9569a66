package promleader_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pgleader/pgleader/contrib/promleader"
	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/group"
	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/leader"
)

const waitLong = 30 * time.Second

var shared testpg.Shared

func server(t testing.TB) *testpg.Server { return shared.Get(t) }

func TestMain(m *testing.M) { os.Exit(testpg.Main(m, nil, &shared)) }

type node struct {
	e       *elector.Elector
	elected chan time.Time
}

func startNode(t *testing.T, dsn string, key leader.Key, id string, obs leader.Observer) *node {
	t.Helper()
	n := &node{elected: make(chan time.Time, 16)}
	var err error
	n.e, err = elector.New(elector.Config{
		Connect: elector.DSN(dsn), Key: key, Identity: id, Observer: obs,
		RenewInterval: 100 * time.Millisecond, RenewDeadline: 500 * time.Millisecond, LeaseDuration: 1500 * time.Millisecond,
		Callbacks: elector.Callbacks{
			OnElected: func(ctx context.Context, l leader.Leadership) {
				n.elected <- time.Now()
				<-ctx.Done()
			},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); n.e.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return n
}

func wait[T any](t *testing.T, ch chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitLong):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metrics
				}
			}
			return value(m)
		}
	}
	return -1
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return -1
}

func TestMetrics(t *testing.T) {
	s := server(t)
	reg := prometheus.NewRegistry()
	m, err := promleader.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	key := leader.KeyFromName("metrics-test")
	el := map[string]string{"election": "metrics-test"}
	a := startNode(t, s.DSN(), key, "met-a", m)
	wait(t, a.elected, "a elected")
	// The Observer hears of the election just after OnElected has started
	// (nothing of the user's runs before OnElected).
	deadline := time.Now().Add(waitLong)
	for metricValue(t, reg, "pgleader_is_leader", el) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("is_leader %v", metricValue(t, reg, "pgleader_is_leader", el))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if v := metricValue(t, reg, "leader_election_master_status", map[string]string{"name": "metrics-test"}); v != 1 {
		t.Fatalf("master_status %v", v)
	}
	if v := metricValue(t, reg, "pgleader_elections_total", el); v != 1 {
		t.Fatalf("elections_total %v", v)
	}
	// Every reason's counter exists at 0 before its first demotion; the
	// elector is connected; the build is labelled.
	for _, reason := range leader.ReasonLabels {
		if v := metricValue(t, reg, "pgleader_demotions_total", map[string]string{"election": "metrics-test", "reason": reason}); v != 0 {
			t.Fatalf("demotions{%s} %v before any demotion, want 0", reason, v)
		}
	}
	if v := metricValue(t, reg, "pgleader_connected", el); v != 1 {
		t.Fatalf("connected %v", v)
	}
	if v := metricValue(t, reg, "pgleader_build_info", nil); v != 1 {
		t.Fatalf("build_info %v", v)
	}
	if v := metricValue(t, reg, "pgleader_acquire_wait_seconds", el); v != 1 {
		t.Fatalf("acquire_wait count %v", v)
	}
	for metricValue(t, reg, "pgleader_renew_duration_seconds", el) < 1 {
		if time.Now().After(deadline) {
			t.Fatal("no renew observed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if v := metricValue(t, reg, "pgleader_last_renew_timestamp_seconds", el); v < float64(time.Now().Add(-time.Minute).Unix()) {
		t.Fatalf("last_renew %v", v)
	}
	if err := a.e.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	if v := metricValue(t, reg, "pgleader_demotions_total", map[string]string{"election": "metrics-test", "reason": "resigned"}); v != 1 {
		t.Fatalf("demotions{resigned} %v", v)
	}
	wait(t, a.elected, "a elected again") // no one else campaigns
	if _, err := s.TerminateBackend(context.Background(), "met-a"); err != nil {
		t.Fatal(err)
	}
	wait(t, a.elected, "a elected after the kill")
	for metricValue(t, reg, "pgleader_elections_total", el) != 3 && time.Now().Before(deadline.Add(waitLong)) {
		time.Sleep(5 * time.Millisecond)
	}
	if v := metricValue(t, reg, "pgleader_demotions_total", map[string]string{"election": "metrics-test", "reason": "connection_lost"}); v != 1 {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == "pgleader_demotions_total" || mf.GetName() == "pgleader_elections_total" {
				for _, m := range mf.GetMetric() {
					t.Log(mf.GetName(), m.GetLabel(), value(m))
				}
			}
		}
		t.Fatalf("demotions{connection_lost} %v", v)
	}
	if v := metricValue(t, reg, "pgleader_reconnects_total", el); v < 1 {
		t.Fatalf("reconnects %v", v)
	}
	if v := metricValue(t, reg, "pgleader_elections_total", el); v != 3 {
		t.Fatalf("elections_total %v", v)
	}
	if _, err := promleader.NewMetrics(reg); err == nil {
		t.Fatal("registering twice succeeded")
	}
}

// A group's metrics come from its Status at each scrape: a few series,
// whatever its number of keys.
func TestGroupCollector(t *testing.T) {
	s := server(t)
	var keys []leader.Key
	for i := range 6 {
		keys = append(keys, leader.KeyFromName(fmt.Sprintf("group-metrics/%d", i)))
	}
	start := func(id string) *group.Group {
		g, err := group.New(group.Config{Connect: leader.DSN(s.DSN()), Group: "group-metrics", Keys: keys, Identity: id,
			RenewInterval: 100 * time.Millisecond, RenewDeadline: 500 * time.Millisecond, LeaseDuration: 1500 * time.Millisecond,
			Callbacks: group.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) { <-ctx.Done() }}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); g.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		return g
	}
	a := start("gm-a")
	b := start("gm-b")
	reg := prometheus.NewRegistry()
	reg.MustRegister(promleader.NewGroupCollector(a))
	gl := map[string]string{"group": "group-metrics"}
	deadline := time.Now().Add(waitLong)
	for metricValue(t, reg, "pgleader_group_keys_owned", gl) != 3 || metricValue(t, reg, "pgleader_group_members", gl) != 2 || len(b.Owned()) != 3 {
		if time.Now().After(deadline) {
			t.Fatalf("owned %v, members %v", metricValue(t, reg, "pgleader_group_keys_owned", gl), metricValue(t, reg, "pgleader_group_members", gl))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if v := metricValue(t, reg, "pgleader_group_keys", gl); v != 6 {
		t.Fatalf("keys %v", v)
	}
	if v := metricValue(t, reg, "pgleader_group_connected", gl); v != 1 {
		t.Fatalf("connected %v", v)
	}
	if v := metricValue(t, reg, "pgleader_group_elections_total", gl); v < 3 {
		t.Fatalf("elections %v", v)
	}
	if v := metricValue(t, reg, "pgleader_group_rounds_total", map[string]string{"group": "group-metrics", "kind": "full"}); v < 1 {
		t.Fatalf("full rounds %v", v)
	}
	// A resign, like a hand-over to a member that joined, counts as
	// resigned.
	resigned := map[string]string{"group": "group-metrics", "reason": "resigned"}
	before := metricValue(t, reg, "pgleader_group_demotions_total", resigned)
	if err := a.Resign(context.Background(), a.Owned()[0]); err != nil {
		t.Fatal(err)
	}
	if v := metricValue(t, reg, "pgleader_group_demotions_total", resigned); v != before+1 {
		t.Fatalf("demotions{resigned} %v after a resign, %v before", v, before)
	}
	if v := metricValue(t, reg, "pgleader_group_demotions_total", map[string]string{"group": "group-metrics", "reason": "lock_lost"}); v != 0 {
		t.Fatalf("demotions{lock_lost} %v", v)
	}
}
