package otelleader_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/pgleader/pgleader/contrib/otelleader"
	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/leader"
	"github.com/pgleader/pgleader/pgleadertest"
)

var shared pgleadertest.Shared

func TestMain(m *testing.M) {
	code := pgleadertest.Main(m, &shared)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// An elector with the OTel observer, against a real server: the SDK's
// in-memory reader reads back the instruments, and the span recorder the
// tenure's span.
func TestInstrumentsReadBack(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.Background())
	obs, err := otelleader.New(mp, otelleader.Options{Tracer: tp.Tracer("test")})
	if err != nil {
		t.Fatal(err)
	}
	srv := shared.Get(t)
	elected := make(chan struct{})
	e, err := elector.New(elector.Config{
		Connect: leader.DSN(srv.DSN()), Key: leader.KeyFromName("otel-election"), Identity: "otel-1", Observer: obs,
		RenewInterval: 50 * time.Millisecond, RenewDeadline: 500 * time.Millisecond, LeaseDuration: 1500 * time.Millisecond,
		Callbacks: elector.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) {
			close(elected)
			<-ctx.Done()
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	select {
	case <-elected:
	case <-time.After(30 * time.Second):
		t.Fatal("not elected")
	}
	deadline := time.Now().Add(30 * time.Second)
	for e.Status().LastRenew.IsZero() || time.Since(e.Status().Since) < 200*time.Millisecond {
		if time.Now().After(deadline) {
			t.Fatal("no renews")
		}
		time.Sleep(10 * time.Millisecond)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Gauge[int64]:
				got[m.Name] = float64(d.DataPoints[0].Value)
			case metricdata.Sum[int64]:
				got[m.Name] = float64(d.DataPoints[0].Value)
			case metricdata.Histogram[float64]:
				got[m.Name] = float64(d.DataPoints[0].Count)
				if v, ok := d.DataPoints[0].Attributes.Value("pgleader.election"); !ok || v.AsString() != "otel-election" {
					t.Errorf("%s: attribute pgleader.election = %v", m.Name, v)
				}
			}
		}
	}
	for name, min := range map[string]float64{"pgleader.leader": 1, "pgleader.connected": 1, "pgleader.elections": 1,
		"pgleader.acquire.duration": 1, "pgleader.renew.duration": 1} {
		if got[name] < min {
			t.Errorf("%s = %v, want at least %v (all: %v)", name, got[name], min, got)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The tenure is a span, ended by the demotion.
	ended := spans.Ended()
	if len(ended) != 1 || ended[0].Name() != "pgleader.tenure" {
		t.Fatalf("spans %v, want one pgleader.tenure", ended)
	}
	found := false
	for _, a := range ended[0].Attributes() {
		found = found || a == attribute.String("pgleader.identity", "otel-1")
	}
	if !found || len(ended[0].Events()) != 1 {
		t.Fatalf("tenure span: attributes %v, events %v", ended[0].Attributes(), ended[0].Events())
	}
}

// Wiring the observer into an elector.
func ExampleNew() {
	mp := sdkmetric.NewMeterProvider() // your application's MeterProvider
	obs, err := otelleader.New(mp, otelleader.Options{})
	if err != nil {
		panic(err)
	}
	_, err = elector.New(elector.Config{
		Connect:   leader.DSN("postgres://app@db.internal/app"),
		Key:       leader.KeyFromName("billing-consumer"),
		Observer:  obs,
		Callbacks: elector.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) { <-ctx.Done() }},
	})
	fmt.Println(err)
	// Output: <nil>
}

func TestNewRefusesANilProvider(t *testing.T) {
	if obs, err := otelleader.New(nil, otelleader.Options{}); err == nil || obs != nil {
		t.Fatalf("New(nil): %v, %v; want an error", obs, err)
	}
}
