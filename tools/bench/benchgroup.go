package main

import (
	"context"
	"fmt"
	"sort"
	"syscall"
	"time"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/internal/harness/fleet"
)

// groupFleet is a group's member processes (the candidate subcommand in
// group mode), and what their events say: who leads which key, and every
// tenure, for the check that no key was led by two members at once.
type groupFleet struct {
	b     *bencher
	o     fleet.Options
	f     *fleet.Fleet
	next  int
	live  []string
	owner map[string]string // key -> member, by the events' stamps
	count map[string]int    // member -> keys it owns
	since map[string]int64  // key -> the stamp of its owner's election
	// Every tenure, by key: elected and returned (or killed) stamps.
	tenures map[string][]tenure
	killed  map[string]int64 // member -> when it was SIGKILLed
	last    fleet.Event      // the last event applied
	log     []fleet.Event    // every event applied, in the order it arrived
}

type tenure struct {
	member   string
	from, to int64 // to: OnElected returned (0: not yet)
}

func (b *bencher) newGroupFleet(keys int, single bool) (*groupFleet, error) {
	name := b.name("group")
	g := &groupFleet{b: b, f: fleet.New(b.exe), owner: map[string]string{}, count: map[string]int{}, since: map[string]int64{}, tenures: map[string][]tenure{}, killed: map[string]int64{},
		o: fleet.Options{DSN: b.dsn, Key: name, Keys: keys, SingleConnection: single}}
	for range 3 {
		if err := g.add(); err != nil {
			g.stop()
			return nil, err
		}
	}
	if _, err := g.balanced(2 * time.Minute); err != nil {
		g.stop()
		return nil, err
	}
	return g, nil
}

func (g *groupFleet) add() error {
	g.next++
	o := g.o
	o.ID = fmt.Sprintf("group-%d", g.next)
	if _, err := g.f.Add(o); err != nil {
		return err
	}
	g.live = append(g.live, o.ID)
	return nil
}

// apply takes one event into the fleet's view.
func (g *groupFleet) apply(e fleet.Event) {
	g.last = e
	g.log = append(g.log, e)
	switch e.Ev {
	case "elected":
		// Each process's events come through a pipe of its own, so an
		// older election may arrive after a newer one: the stamp decides.
		if e.Mono >= g.since[e.Data] {
			g.setOwner(e.Data, e.Identity)
			g.since[e.Data] = e.Mono
		}
		g.tenures[e.Data] = append(g.tenures[e.Data], tenure{member: e.Identity, from: e.Mono})
	case "returned":
		ts := g.tenures[e.Data]
		for i := len(ts) - 1; i >= 0; i-- {
			if ts[i].member == e.Identity && ts[i].to == 0 {
				ts[i].to = e.Mono
				break
			}
		}
	case "demoted":
		if g.owner[e.Data] == e.Identity && e.Mono >= g.since[e.Data] {
			g.setOwner(e.Data, "")
		}
	}
}

// setOwner records key's owner ("": none), and keeps the count of keys
// per member that isBalanced reads: at 100,000 keys, counting them again
// after every event made the bench itself the bottleneck.
func (g *groupFleet) setOwner(key, member string) {
	if old, ok := g.owner[key]; ok {
		g.count[old]--
		if g.count[old] == 0 {
			delete(g.count, old)
		}
	}
	if member == "" {
		delete(g.owner, key)
		return
	}
	g.owner[key] = member
	g.count[member]++
}

// until applies events until cond holds, and returns the stamp of the
// event that made it hold.
func (g *groupFleet) until(timeout time.Duration, what string, cond func() bool) (int64, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for !cond() {
		select {
		case e := <-g.f.Events:
			g.apply(e)
		case <-deadline.C:
			return 0, fmt.Errorf("no %s within %s", what, timeout)
		}
	}
	return g.last.Mono, nil
}

// firstSince returns the time of the first event from g.log[from:] on (those
// applied already, then those to come) that match accepts, waiting a
// minute at most.
func (g *groupFleet) firstSince(from int, what string, match func(fleet.Event) bool) (int64, error) {
	for _, e := range g.log[from:] {
		if match(e) {
			return e.Mono, nil
		}
	}
	return g.until(time.Minute, what, func() bool { return match(g.last) })
}

// stop stops every member, applying their events meanwhile: a member that
// stops sends an event per key, more than the event channel holds at
// 100,000 keys, and one whose pipe is full never exits.
func (g *groupFleet) stop() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.f.StopAll()
	}()
	for {
		select {
		case e := <-g.f.Events:
			g.apply(e)
		case <-done:
			g.drain()
			return
		}
	}
}

// drain applies the events already waiting.
func (g *groupFleet) drain() {
	for {
		select {
		case e := <-g.f.Events:
			g.apply(e)
		default:
			return
		}
	}
}

// isBalanced: every key led by a live member, each with ⌊K/M⌋ or ⌈K/M⌉.
func (g *groupFleet) isBalanced() bool {
	if len(g.owner) != g.o.Keys {
		return false
	}
	count := g.count
	lo := g.o.Keys / len(g.live)
	hi := lo
	if g.o.Keys%len(g.live) != 0 {
		hi++
	}
	for _, m := range g.live {
		if count[m] < lo || count[m] > hi {
			return false
		}
	}
	return len(count) == len(g.live)
}

func (g *groupFleet) balanced(timeout time.Duration) (int64, error) {
	return g.until(timeout, "balanced group", g.isBalanced)
}

// overlaps counts pairs of tenures of one key that overlap: a new tenure
// that began before the previous one's OnElected returned, unless that
// member was SIGKILLed before it began (its process, and its work, were
// gone).
func (g *groupFleet) overlaps() (n int, checked int) {
	for _, ts := range g.tenures {
		sort.Slice(ts, func(i, j int) bool { return ts[i].from < ts[j].from })
		for i := 1; i < len(ts); i++ {
			checked++
			prev := ts[i-1]
			end := prev.to
			if k, ok := g.killed[prev.member]; ok && (end == 0 || k < end) {
				end = k
			}
			if end == 0 || end > ts[i].from {
				n++
			}
		}
	}
	return n, checked
}

// group measures group.Group: a member SIGKILLed (its keys led again by
// the survivors, and the group balanced again), a member joining, and a
// key resigned, with `keys` keys on 3 members at the default timings; then
// the standing cost of `standing` keys on 3 members. Every tenure of the
// run is checked for overlap at the end.
func (b *bencher) group(keys, runs, resignRuns, standing int, window time.Duration) error {
	interval := elector.DefaultRenewInterval
	g, err := b.newGroupFleet(keys, b.groupSingle)
	if err != nil {
		return err
	}
	defer g.stop()
	kind := ""
	if b.groupSingle {
		kind = ", SingleConnection"
	}
	var kills, kbal, joins, resigns, returned, released, taken []float64
	for run := 0; run < runs; run++ {
		// Settle: the last join's hand-overs and NOTIFYs are over.
		time.Sleep(1500 * time.Millisecond)
		g.drain()
		if !g.isBalanced() {
			if _, err := g.balanced(time.Minute); err != nil {
				return err
			}
		}
		victim := g.live[run%len(g.live)]
		var theirs []string
		for k, m := range g.owner {
			if m == victim {
				theirs = append(theirs, k)
			}
		}
		c := g.f.Get(victim)
		g.f.Remove(victim)
		g.live = removeString(g.live, victim)
		k0 := fleet.Mono()
		if err := c.Signal(syscall.SIGKILL); err != nil {
			return err
		}
		g.killed[victim] = k0
		for _, k := range theirs {
			g.setOwner(k, "")
		}
		last, err := g.until(time.Minute, "takeover of the killed member's keys", func() bool {
			if len(g.owner) != g.o.Keys {
				return false // cheap: only its keys are unowned
			}
			for _, k := range theirs {
				if _, ok := g.owner[k]; !ok {
					return false
				}
			}
			return true
		})
		if err != nil {
			return err
		}
		kills = append(kills, ms(last-k0))
		bal, err := g.balanced(time.Minute)
		if err != nil {
			return err
		}
		kbal = append(kbal, float64(bal-k0)/float64(interval))
		// A replacement joins; measured from its process's start event.
		time.Sleep(500 * time.Millisecond)
		if err := g.add(); err != nil {
			return err
		}
		joiner := g.live[len(g.live)-1]
		if _, err := g.until(time.Minute, "the joiner's start", func() bool { return g.last.Ev == "started" && g.last.Identity == joiner }); err != nil {
			return err
		}
		j0 := g.last.Mono
		bal, err = g.balanced(time.Minute)
		if err != nil {
			return err
		}
		joins = append(joins, float64(bal-j0)/float64(interval))
		fmt.Fprintf(b.out, "bench: group run %d: %d keys of %s led again %.1f ms after its SIGKILL; balanced after a join in %.2f intervals\n",
			run+1, len(theirs), victim, kills[len(kills)-1], joins[len(joins)-1])
	}
	// Resigns: one key at a time, by its owner, to whichever member the
	// assignment gives it.
	for run := 0; run < resignRuns; run++ {
		time.Sleep(200 * time.Millisecond)
		g.drain()
		m := g.live[run%len(g.live)]
		from := len(g.log)
		if err := g.f.Get(m).Send("resign"); err != nil {
			return err
		}
		if _, err := g.until(time.Minute, "resigning", func() bool { return g.last.Ev == "resigning" && g.last.Identity == m }); err != nil {
			return err
		}
		r0, key := g.last.Mono, g.last.Data
		// Each process's events come through a pipe of its own, so the
		// new leader's may arrive before the resigning member's.
		at, err := g.firstSince(from, "the resigned key's new leader", func(e fleet.Event) bool {
			return e.Ev == "elected" && e.Data == key && e.Identity != m && e.Mono >= r0
		})
		if err != nil {
			return err
		}
		resigns = append(resigns, ms(at-r0))
		// The resigner's OnDemoted runs once its lock is released: it
		// splits the resign into the resigning member's part and the
		// new member's; its OnElected returned before.
		mine := func(ev string) func(e fleet.Event) bool {
			return func(e fleet.Event) bool { return e.Ev == ev && e.Data == key && e.Identity == m && e.Mono >= r0 }
		}
		rel, err := g.firstSince(from, "the resigning member's OnDemoted", mine("demoted"))
		if err != nil {
			return err
		}
		ret, err := g.firstSince(from, "the resigning member's OnElected return", mine("returned"))
		if err != nil {
			return err
		}
		returned = append(returned, ms(ret-r0))
		released = append(released, ms(rel-r0))
		taken = append(taken, ms(at-rel))
		// A resign that waits for a later round (half an interval or more)
		// is named, for the members' debug logs (PGLEADER_FLEET_LOGDIR).
		if took := at - r0; time.Duration(took) >= interval/2 {
			fmt.Fprintf(b.out, "bench: group resign %d: %s's resign of %s took %.1f ms to its new leader\n", run+1, m, key, ms(took))
		}
	}
	g.stop()
	g.drain()
	n, checked := g.overlaps()
	b.add("group-kill", fmt.Sprintf("SIGKILL to the last of its keys led again (%d keys, 3 members%s)", keys, kind), "ms", "p99 <= 1000", kills)
	b.add("group-kill", "SIGKILL to balanced again", "intervals", "<= 3", kbal)
	b.add("group-join", "a member's start to balanced (3 members)", "intervals", "<= 3", joins)
	b.add("group-resign", "resign to the new member's OnElected", "ms", "p99 <= 5", resigns)
	b.add("group-resign", "  resign to the resigning member's OnElected returned", "ms", "", returned)
	b.add("group-resign", "  resign to the resigning member's OnDemoted (its lock released)", "ms", "", released)
	b.add("group-resign", "  that OnDemoted to the new member's OnElected", "ms", "", taken)
	b.add("group", fmt.Sprintf("tenures that overlapped the key's previous one (of %d checked)", checked), "count", "0", []float64{float64(n)})
	if standing > 0 && b.srv != nil {
		return b.groupStanding(standing, window)
	}
	return nil
}

// groupStanding measures what `keys` keys on 3 standing members cost the
// server: its CPU (the median of three slices of window, with the idle
// server's own measured just before), its log lines, and the
// transactions each member commits per second (a round is one).
func (b *bencher) groupStanding(keys int, window time.Duration) error {
	slices3 := func() float64 {
		var cpus []float64
		for i := 0; i < 3; i++ {
			cpu0, began := b.serverCPU(), time.Now()
			time.Sleep(window / 3)
			cpus = append(cpus, (b.serverCPU()-cpu0)/time.Since(began).Seconds())
		}
		return median(cpus)
	}
	idle := slices3()
	life0 := b.srv.LogLinesOf("group-")
	g, err := b.newGroupFleet(keys, false)
	if err != nil {
		return err
	}
	stopped := false
	defer func() {
		if !stopped {
			g.stop()
		}
	}()
	time.Sleep(3 * time.Second) // the takes and first rounds done
	logs0 := b.srv.LogLinesOf("group-")
	s0, err := g.stats()
	if err != nil {
		return err
	}
	cpu := slices3()
	s1, err := g.stats()
	if err != nil {
		return err
	}
	// Round trips per member per second, from the members' own counts.
	var full, light, watch, scans []float64
	for id, a := range s0 {
		z := s1[id]
		secs := float64(z.mono-a.mono) / 1e9
		full = append(full, float64(z.rounds-a.rounds)/secs)
		light = append(light, float64(z.light-a.light)/secs)
		watch = append(watch, float64(z.watch-a.watch)/secs)
		scans = append(scans, 60*float64(z.scans-a.scans)/secs)
	}
	logs := b.srv.LogLinesOf("group-") - logs0
	var watching int
	b.admin.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'CALL pg_temp.pgleader_ring(%' AND state = 'active'`).Scan(&watching)
	g.stop()
	stopped = true
	life := b.lifeLines(life0, "group-")
	b.add("group-standing", "crash watches waiting at the end of the window", "sessions", "3", []float64{float64(watching)})
	b.add("group-standing", fmt.Sprintf("server CPU, %d keys on 3 members (idle server subtracted)", keys), "% core", "<= 5", []float64{100 * (cpu - idle)})
	b.add("group-standing", "server CPU of the idle server, same window", "% core", "", []float64{100 * idle})
	b.add("group-standing", "full rounds per member per second (one round trip each)", "1/s", "1 (RenewInterval 1s)", full)
	b.add("group-standing", "scans of pg_locks per member per minute", "1/min", "<= 60, 0.5 % of the member's time", scans)
	b.add("group-standing", "light rounds per member per second", "1/s", "0 while nothing moves", light)
	b.add("group-standing", "crash-watch waits per member per second (each sleeps on the server)", "1/s", "", watch)
	b.add("group-standing", fmt.Sprintf("server log lines from the group in %s", window), "lines", "0", []float64{float64(logs)})
	b.add("group-standing", "server log lines from the group, from its start to its stop", "lines", "0", []float64{float64(life)})
	fmt.Fprintf(b.out, "bench: group standing, %d keys: server CPU %.2f%% of a core (idle %.2f%%), per member per second %.2f full rounds, %.2f light rounds, %.2f watch waits, %.1f scans a minute; %d log lines standing, %d from start to stop\n",
		keys, 100*cpu, 100*idle, median(full), median(light), median(watch), median(scans), logs, life)
	return nil
}

// memberStats are a member's counts, as its "stats" event gives them.
type memberStats struct {
	mono                        int64
	rounds, light, watch, scans int64
}

// stats asks every live member for its counts.
func (g *groupFleet) stats() (map[string]memberStats, error) {
	out := map[string]memberStats{}
	for _, id := range g.live {
		if err := g.f.Get(id).Send("stats"); err != nil {
			return nil, err
		}
	}
	_, err := g.until(time.Minute, "every member's stats", func() bool {
		if e := g.last; e.Ev == "stats" {
			var heap, cpu int64
			var s memberStats
			fmt.Sscanf(e.Data, "%d %d %d %d %d %d", &heap, &cpu, &s.rounds, &s.light, &s.watch, &s.scans)
			s.mono = e.Mono
			out[e.Identity] = s
		}
		return len(out) == len(g.live)
	})
	return out, err
}

// serverCPU is the CPU time the server's processes have used so far, in
// seconds, read from their own accounting (/proc); -1 when the server is
// not the bench's throwaway one: a --dsn server's processes are not this
// machine's to read, and its CPU is not measured.
func (b *bencher) serverCPU() float64 {
	if b.srv == nil {
		return -1
	}
	return b.srv.CPU()
}

func removeString(s []string, v string) []string {
	out := s[:0:0]
	for _, x := range s {
		if x != v {
			out = append(out, x)
		}
	}
	return out
}
