// Package promleader keeps Prometheus metrics for pgleader's electors. It
// is a module of its own (github.com/pgleader/pgleader/contrib/promleader),
// so that a program that does not ask for metrics links no Prometheus.
//
//	metrics, err := promleader.NewMetrics(prometheus.DefaultRegisterer)
//	e, err := elector.New(elector.Config{..., Observer: metrics})
//
// An group.Group has a collector of its own, with a few series per group
// rather than a set per key:
//
//	prometheus.MustRegister(promleader.NewGroupCollector(g))
package promleader

import (
	"runtime"
	"runtime/debug"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgleader/pgleader/leader"
)

// Metrics is a leader.Observer that keeps Prometheus metrics. One Metrics
// serves any number of electors; series are labelled by election (the key's
// name, or its number). Pass it as elector.Config.Observer.
//
//	pgleader_is_leader{election}                       gauge, 1 while this process leads
//	leader_election_master_status{name}                gauge, the same under client-go's name
//	pgleader_elections_total{election}                 counter
//	pgleader_demotions_total{election,reason}          counter; reason as leader.ReasonLabel
//	pgleader_acquire_wait_seconds{election}            histogram, campaign start to lock grant
//	pgleader_renew_duration_seconds{election}          histogram, one renew round trip
//	pgleader_reconnects_total{election}                counter
//	pgleader_last_renew_timestamp_seconds{election}    gauge, Unix time of the last successful renew
//	pgleader_term{election}                            gauge, the current fencing term while leading
//	pgleader_connected{election}                       gauge, 1 while the elector has its session (leader or follower)
//	pgleader_build_info{version,goversion}             gauge, 1: the pgleader module's version
//
// Every series of an election, pgleader_demotions_total for each reason
// included, exists at 0 from the first campaign on, so that rate() and
// absent() alerts work before the first event.
type Metrics struct {
	isLeader     *prometheus.GaugeVec
	masterStatus *prometheus.GaugeVec
	elections    *prometheus.CounterVec
	demotions    *prometheus.CounterVec
	acquireWait  *prometheus.HistogramVec
	renew        *prometheus.HistogramVec
	reconnects   *prometheus.CounterVec
	lastRenew    *prometheus.GaugeVec
	term         *prometheus.GaugeVec
	connected    *prometheus.GaugeVec
	buildInfo    *prometheus.GaugeVec
}

var _ leader.Observer = (*Metrics)(nil)

// NewMetrics creates the metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	l := []string{"election"}
	m := &Metrics{
		isLeader: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pgleader_is_leader",
			Help: "1 while this process leads the election, else 0."}, l),
		masterStatus: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "leader_election_master_status",
			Help: "1 while this process leads (client-go's name, for existing dashboards)."}, []string{"name"}),
		elections: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgleader_elections_total",
			Help: "Times this process was elected."}, l),
		demotions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgleader_demotions_total",
			Help: "Times this process stepped down, by reason."}, []string{"election", "reason"}),
		acquireWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "pgleader_acquire_wait_seconds",
			Help:    "Time from the start of a campaign (or a lock call) until the lock was granted.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 12)}, l),
		renew: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "pgleader_renew_duration_seconds",
			Help:    "Round-trip time of a leader's renew.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 12)}, l),
		reconnects: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgleader_reconnects_total",
			Help: "Connection attempts after a failure or a lost connection."}, l),
		lastRenew: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pgleader_last_renew_timestamp_seconds",
			Help: "Unix time of the last successful renew."}, l),
		term: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pgleader_term",
			Help: "The fencing term of the current tenure (0 when not leading or without fencing)."}, l),
		connected: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pgleader_connected",
			Help: "1 while the elector has its database session, leading or following; 0 while it reconnects."}, l),
		buildInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pgleader_build_info",
			Help: "1, labelled with the pgleader module's version and the Go version."}, []string{"version", "goversion"}),
	}
	for _, c := range []prometheus.Collector{m.isLeader, m.masterStatus, m.elections, m.demotions,
		m.acquireWait, m.renew, m.reconnects, m.lastRenew, m.term, m.connected, m.buildInfo} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	m.buildInfo.WithLabelValues(moduleVersion()).Set(1)
	return m, nil
}

// moduleVersion is the version of the pgleader module in this build, and
// the Go version.
func moduleVersion() (string, string) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown", runtime.Version()
	}
	for _, d := range append([]*debug.Module{&bi.Main}, bi.Deps...) {
		if d.Path == "github.com/pgleader/pgleader" {
			if d.Replace != nil && d.Replace.Version != "" {
				return d.Replace.Version, bi.GoVersion
			}
			return d.Version, bi.GoVersion
		}
	}
	return "unknown", bi.GoVersion
}

// Election returns the label value used for key: its name when it has one.
func Election(key leader.Key) string {
	if n := key.Name(); n != "" {
		return n
	}
	return key.String()
}

func (m *Metrics) setLeading(key leader.Key, v float64) {
	m.isLeader.WithLabelValues(Election(key)).Set(v)
	m.masterStatus.WithLabelValues(Election(key)).Set(v)
}

// Campaigning makes the election's series exist, at 0 (a demotion
// counter for every reason), and marks it connected.
func (m *Metrics) Campaigning(key leader.Key, _ string) {
	el := Election(key)
	m.setLeading(key, 0)
	m.elections.WithLabelValues(el)
	m.reconnects.WithLabelValues(el)
	for _, r := range leader.ReasonLabels {
		m.demotions.WithLabelValues(el, r)
	}
	m.connected.WithLabelValues(el).Set(1)
}

// LockWaited observes the acquire wait of a granted lock.
func (m *Metrics) LockWaited(key leader.Key, wait time.Duration, acquired bool) {
	if acquired {
		m.acquireWait.WithLabelValues(Election(key)).Observe(wait.Seconds())
	}
}

// Elected counts an election and sets the leader gauges.
func (m *Metrics) Elected(l leader.Leadership) {
	m.connected.WithLabelValues(Election(l.Key)).Set(1)
	m.elections.WithLabelValues(Election(l.Key)).Inc()
	m.setLeading(l.Key, 1)
	m.term.WithLabelValues(Election(l.Key)).Set(float64(l.Term))
	m.lastRenew.WithLabelValues(Election(l.Key)).Set(float64(time.Now().UnixNano()) / 1e9)
}

// Renewed observes a renew.
func (m *Metrics) Renewed(l leader.Leadership, latency time.Duration) {
	m.renew.WithLabelValues(Election(l.Key)).Observe(latency.Seconds())
	m.lastRenew.WithLabelValues(Election(l.Key)).Set(float64(time.Now().UnixNano()) / 1e9)
}

// Demoted counts a demotion by reason and clears the leader gauges.
func (m *Metrics) Demoted(l leader.Leadership, reason error) {
	m.demotions.WithLabelValues(Election(l.Key), leader.ReasonLabel(reason)).Inc()
	m.setLeading(l.Key, 0)
	m.term.WithLabelValues(Election(l.Key)).Set(0)
}

// Reconnecting counts a reconnect attempt.
func (m *Metrics) Reconnecting(key leader.Key, _ string, _ int, _ time.Duration, _ error) {
	m.reconnects.WithLabelValues(Election(key)).Inc()
	m.connected.WithLabelValues(Election(key)).Set(0)
}
