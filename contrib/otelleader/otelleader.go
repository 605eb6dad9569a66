// Package otelleader is a leader.Observer over OpenTelemetry: the same
// measurements as contrib/promleader, as OTel instruments, and, when a
// tracer is given, a span per tenure. It is a module of its own
// (github.com/pgleader/pgleader/contrib/otelleader), so that a program that
// does not use OpenTelemetry links none of it.
//
//	obs, err := otelleader.New(otel.GetMeterProvider(), otelleader.Options{Tracer: otel.Tracer("pgleader")})
//	e, err := elector.New(elector.Config{..., Observer: obs})
//
// The instruments, each with the attribute pgleader.election (the key's
// name, or its number):
//
//	pgleader.leader              Int64Gauge           1 while this process leads, else 0
//	pgleader.connected           Int64Gauge           1 while the elector has its session
//	pgleader.term                Int64Gauge           the current fencing term while leading, else 0
//	pgleader.elections           Int64Counter         tenures begun
//	pgleader.demotions           Int64Counter         tenures ended, with pgleader.reason (leader.ReasonLabel)
//	pgleader.reconnects          Int64Counter         connection attempts after a failure or a lost connection
//	pgleader.acquire.duration    Float64Histogram, s  from the start of a campaign (or a lock call) to the grant
//	pgleader.renew.duration      Float64Histogram, s  one renew round trip
//
// With Options.Tracer, each tenure is a span, pgleader.tenure, from the
// election to the demotion, with the term and the backend pid as
// attributes and the reason as an event (an error status for a fault).
package otelleader

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgleader/pgleader/leader"
)

// Options configure the observer.
type Options struct {
	// Tracer, when set, records each tenure as a span.
	Tracer trace.Tracer
}

// Observer is a leader.Observer that records OpenTelemetry measurements
// (and spans). One Observer serves any number of electors.
type Observer struct {
	leading, connected, term         metric.Int64Gauge
	elections, demotions, reconnects metric.Int64Counter
	acquire, renew                   metric.Float64Histogram
	tracer                           trace.Tracer
	mu                               sync.Mutex
	spans                            map[string]trace.Span // election -> its tenure's span
}

var _ leader.Observer = (*Observer)(nil)

// Scope is the instrumentation scope's name.
const Scope = "github.com/pgleader/pgleader/contrib/otelleader"

// New creates the instruments on mp's meter (otel.GetMeterProvider() for
// the global one).
func New(mp metric.MeterProvider, o Options) (*Observer, error) {
	if mp == nil {
		return nil, errors.New("otelleader: New: nil MeterProvider (pass otel.GetMeterProvider() for the global one)")
	}
	m := mp.Meter(Scope)
	obs := &Observer{tracer: o.Tracer, spans: map[string]trace.Span{}}
	var errs []error
	gauge := func(name, desc string) metric.Int64Gauge {
		g, err := m.Int64Gauge(name, metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	counter := func(name, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	hist := func(name, desc string) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithDescription(desc), metric.WithUnit("s"))
		errs = append(errs, err)
		return h
	}
	obs.leading = gauge("pgleader.leader", "1 while this process leads the election, else 0.")
	obs.connected = gauge("pgleader.connected", "1 while the elector has its session (leader or follower).")
	obs.term = gauge("pgleader.term", "The current fencing term while leading, else 0.")
	obs.elections = counter("pgleader.elections", "Tenures begun.")
	obs.demotions = counter("pgleader.demotions", "Tenures ended, by pgleader.reason.")
	obs.reconnects = counter("pgleader.reconnects", "Connection attempts after a failure or a lost connection.")
	obs.acquire = hist("pgleader.acquire.duration", "Time from the start of a campaign (or a lock call) until the lock was granted.")
	obs.renew = hist("pgleader.renew.duration", "Round-trip time of a leader's renew.")
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return obs, nil
}

// Election is the attribute value of an election: the key's name when it
// has one, else its number.
func Election(k leader.Key) string {
	if n := k.Name(); n != "" {
		return n
	}
	return k.String()
}

func attrs(k leader.Key, more ...attribute.KeyValue) metric.MeasurementOption {
	return metric.WithAttributes(append([]attribute.KeyValue{attribute.String("pgleader.election", Election(k))}, more...)...)
}

// Campaigning marks the election's session connected and not leading.
func (o *Observer) Campaigning(key leader.Key, _ string) {
	ctx := context.Background()
	o.connected.Record(ctx, 1, attrs(key))
	o.leading.Record(ctx, 0, attrs(key))
}

// LockWaited records the acquire wait of a granted lock.
func (o *Observer) LockWaited(key leader.Key, wait time.Duration, acquired bool) {
	if acquired {
		o.acquire.Record(context.Background(), wait.Seconds(), attrs(key))
	}
}

// Elected counts the election, sets the gauges, and opens the tenure's span.
func (o *Observer) Elected(l leader.Leadership) {
	ctx := context.Background()
	o.elections.Add(ctx, 1, attrs(l.Key))
	o.leading.Record(ctx, 1, attrs(l.Key))
	o.connected.Record(ctx, 1, attrs(l.Key))
	o.term.Record(ctx, l.Term, attrs(l.Key))
	if o.tracer == nil {
		return
	}
	_, span := o.tracer.Start(ctx, "pgleader.tenure", trace.WithTimestamp(l.ElectedAt), trace.WithAttributes(
		attribute.String("pgleader.election", Election(l.Key)), attribute.String("pgleader.identity", l.Identity),
		attribute.Int64("pgleader.term", l.Term), attribute.Int64("pgleader.backend_pid", int64(l.BackendPID))))
	o.mu.Lock()
	if old := o.spans[Election(l.Key)]; old != nil {
		old.End()
	}
	o.spans[Election(l.Key)] = span
	o.mu.Unlock()
}

// Renewed records a renew's round trip.
func (o *Observer) Renewed(l leader.Leadership, latency time.Duration) {
	o.renew.Record(context.Background(), latency.Seconds(), attrs(l.Key))
}

// Demoted counts the demotion by reason, clears the gauges, and ends the
// tenure's span with the reason.
func (o *Observer) Demoted(l leader.Leadership, reason error) {
	ctx := context.Background()
	label := leader.ReasonLabel(reason)
	o.demotions.Add(ctx, 1, attrs(l.Key, attribute.String("pgleader.reason", label)))
	o.leading.Record(ctx, 0, attrs(l.Key))
	o.term.Record(ctx, 0, attrs(l.Key))
	o.mu.Lock()
	span := o.spans[Election(l.Key)]
	delete(o.spans, Election(l.Key))
	o.mu.Unlock()
	if span == nil {
		return
	}
	span.AddEvent("demoted", trace.WithAttributes(attribute.String("pgleader.reason", label)))
	if !graceful(reason) {
		span.SetStatus(codes.Error, reason.Error())
	}
	span.End()
}

// graceful reports a step-down the leader chose.
func graceful(reason error) bool {
	return reason == nil || errors.Is(reason, leader.ErrResigned) || errors.Is(reason, leader.ErrCallbackReturned) ||
		errors.Is(reason, context.Canceled)
}

// Reconnecting counts the attempt and marks the session lost.
func (o *Observer) Reconnecting(key leader.Key, _ string, _ int, _ time.Duration, _ error) {
	ctx := context.Background()
	o.reconnects.Add(ctx, 1, attrs(key))
	o.connected.Record(ctx, 0, attrs(key))
}
