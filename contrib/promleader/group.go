package promleader

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgleader/pgleader/group"
	"github.com/pgleader/pgleader/leader"
)

// GroupCollector is a prometheus.Collector for group.Groups: it reads
// each group's Status at every scrape, so a group of any size costs a
// handful of series, not a set per key.
//
//	pgleader_group_members{group}                     gauge, members seen in the last full round
//	pgleader_group_keys{group}                        gauge, the size of the key set
//	pgleader_group_keys_owned{group}                  gauge, keys this member leads now
//	pgleader_group_connected{group}                   gauge, 1 while the member has its session
//	pgleader_group_rounds_total{group,kind}           counter; kind full or light
//	pgleader_group_elections_total{group}             counter, tenures begun
//	pgleader_group_demotions_total{group,reason}      counter, tenures ended; reason as leader.ReasonLabel
//	pgleader_group_last_round_timestamp_seconds{group} gauge, Unix time of the last full round
type GroupCollector struct {
	groups []*group.Group

	members, keys, owned, connected, lastRound *prometheus.Desc
	rounds, elections, demotions               *prometheus.Desc
}

// NewGroupCollector returns a collector for groups; register it with
// reg.MustRegister or reg.Register.
func NewGroupCollector(groups ...*group.Group) *GroupCollector {
	l := []string{"group"}
	return &GroupCollector{groups: groups,
		members:   prometheus.NewDesc("pgleader_group_members", "Members of the group in the last full round.", l, nil),
		keys:      prometheus.NewDesc("pgleader_group_keys", "Keys of the group.", l, nil),
		owned:     prometheus.NewDesc("pgleader_group_keys_owned", "Keys of the group this member leads now.", l, nil),
		connected: prometheus.NewDesc("pgleader_group_connected", "1 while the member has its database session, else 0.", l, nil),
		lastRound: prometheus.NewDesc("pgleader_group_last_round_timestamp_seconds", "Unix time of the last full round.", l, nil),
		rounds:    prometheus.NewDesc("pgleader_group_rounds_total", "Rounds, full (every key proven) or light (a hand-over).", []string{"group", "kind"}, nil),
		elections: prometheus.NewDesc("pgleader_group_elections_total", "Tenures this member began.", l, nil),
		demotions: prometheus.NewDesc("pgleader_group_demotions_total", "Tenures this member ended, by reason.", []string{"group", "reason"}, nil),
	}
}

// Describe sends the descriptors.
func (c *GroupCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.members, c.keys, c.owned, c.connected, c.lastRound, c.rounds, c.elections, c.demotions} {
		ch <- d
	}
}

// Collect sends each group's state.
func (c *GroupCollector) Collect(ch chan<- prometheus.Metric) {
	for _, g := range c.groups {
		st := g.Status()
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, st.Group)
		}
		gauge(c.members, float64(len(st.Members)))
		gauge(c.keys, float64(st.Keys))
		gauge(c.owned, float64(st.Owned))
		connected := 0.0
		if st.Connected {
			connected = 1
		}
		gauge(c.connected, connected)
		if !st.LastRound.IsZero() {
			gauge(c.lastRound, float64(st.LastRound.UnixNano())/1e9)
		}
		ch <- prometheus.MustNewConstMetric(c.rounds, prometheus.CounterValue, float64(st.Rounds), st.Group, "full")
		ch <- prometheus.MustNewConstMetric(c.rounds, prometheus.CounterValue, float64(st.LightRounds), st.Group, "light")
		ch <- prometheus.MustNewConstMetric(c.elections, prometheus.CounterValue, float64(st.Elected), st.Group)
		for _, r := range leader.ReasonLabels {
			ch <- prometheus.MustNewConstMetric(c.demotions, prometheus.CounterValue, float64(st.Demoted[r]), st.Group, r)
		}
	}
}
