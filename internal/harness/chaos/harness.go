// Package chaos is pgleader's fault harness: electors run as real OS
// processes, each behind its own TCP proxy, against a throwaway PostgreSQL
// with a synchronous standby, while a seeded random schedule injects
// faults, slow drains among them, while a sixth elector can reach only the
// standby. A checker then verifies, one function each, safety
// (checkSafety), fencing (checkTerms, checkWrites), liveness (during the
// schedule), callback pairing (checkCallbacks), drains, standbys and leaked
// goroutines (checkProcess) and leftover sessions (checkSessions), from the
// processes' event logs (stamped on CLOCK_MONOTONIC) and the database.
package chaos

import (
	"context"
	"fmt"
	"math/rand"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/leader"
)

// Config is one harness run.
type Config struct {
	Seed     int64
	Duration time.Duration
	Electors int      // real electors (default 5)
	Broken   int      // broken electors (no checks), to prove the checker fails
	Faults   []string // fault types to draw from (default AllFaults)
	Failover bool     // promote the standby once, about 70% into the run
	// Group runs the electors as members of one group.Group with Keys
	// keys (default 100): the same faults, every check per key, and
	// liveness means every key led.
	Group bool
	Keys  int
	// Hostile runs a hostile tenant beside the faults (see hostile.go):
	// the electors run as a role whose search_path another role has
	// shadowed, and that role forges notifications, squats pgleader's
	// locks and fills the lock table.
	Hostile bool
	// Ranked gives the electors priorities 0, 1 and 2 in turn
	// (elector.Config.Priority): leaders hand over to preferred
	// candidates, and leaving ones to the best, beside the faults.
	Ranked bool
}

// AllFaults are the fault types the schedule draws from.
var AllFaults = []string{"kill", "pause", "long-pause", "terminate", "cut", "blackhole", "restart-fast", "restart-immediate", "refuse", "slow-drain"}

type proc struct {
	id      string
	child   *testpg.Child
	proxies []*testpg.Proxy
	killed  int64 // mono of SIGKILL or of the stop request, 0 if running
	stops   [][2]int64
	// standbyOnly: its DSN names only the standby, so until the promotion
	// it reaches only a server in recovery, where it must never lead.
	standbyOnly bool
}

// Report is what a run found.
type Report struct {
	Seed       int64
	Keys       int  // a group's keys; 0 for a single election
	Ranked     bool // the electors had priorities (Config.Ranked)
	Faults     map[string]int
	Recovery   map[string][]time.Duration // fault healed -> a leader again
	Failover   map[string][]time.Duration // fault injected -> the next election
	Violations []string
	Writes     int64
	Stale      int64
	// ServerEnded counts overlaps where the server ended the old leader's
	// session (pg_terminate_backend, a cut connection) or lost its locks (a
	// restart, a failover): the lock is free at once, and the old leader
	// learns it a moment later, or at the end of its trust window when it
	// was cut off at that moment. Only fencing can order those moments;
	// MaxServerEnded is the longest such overlap.
	ServerEnded    int
	MaxServerEnded time.Duration
	// StarvedDrains counts overlaps after a slow drain that lost its lock
	// for a missed renew while its process or server was starved (the
	// paused-process case: see starvedDrain). Fencing orders them.
	StarvedDrains int
	Tenures       int
	// Drains counts slow drains. Their callbacks keep making fenced writes
	// after their context ended, all of which must succeed.
	Drains  int
	history []string
	// HistoryTerms counts the history table's rows for the key, by how
	// each term ended ("" while it lasts); HistoryMissing counts tenures
	// without a row (a row is written with the term, so only a failover
	// that lost a commit would do that).
	HistoryTerms   map[string]int
	HistoryMissing int
	// Hostile counts what the hostile tenant did.
	Hostile map[string]int
}

// OK reports whether no invariant was violated.
func (r *Report) OK() bool { return len(r.Violations) == 0 }

type harness struct {
	mu       sync.Mutex    // current and seq, which the hostile tenant reads
	roles    *testpg.Roles // the hostile mode's roles
	promoted int64         // mono when the promotion was requested, 0 before
	t        testing.TB
	cfg      Config
	rng      *rand.Rand
	primary  *testpg.Server
	standby  *testpg.Server
	current  *testpg.Server
	key      string
	procs    []*proc
	seq      int
	faultLog []testpg.Event
	report   *Report
}

// Run runs the harness and returns its report; it fails t only for harness
// errors, not for violations (the caller decides).
func Run(t testing.TB, cfg Config) *Report {
	if cfg.Electors == 0 {
		cfg.Electors = 5
	}
	if len(cfg.Faults) == 0 {
		cfg.Faults = AllFaults
	}
	if cfg.Group && cfg.Keys == 0 {
		cfg.Keys = 100
	}
	h := &harness{t: t, cfg: cfg, rng: rand.New(rand.NewSource(cfg.Seed)), key: fmt.Sprintf("chaos-%d", cfg.Seed),
		report: &Report{Seed: cfg.Seed, Keys: cfg.Keys, Ranked: cfg.Ranked, Faults: map[string]int{}, Recovery: map[string][]time.Duration{}, Failover: map[string][]time.Duration{}}}
	// A standby reconnects to a restarted primary after
	// wal_retrieve_retry_interval; with synchronous replication commits
	// wait for it, so keep it short.
	h.primary = testpg.Start(t, testpg.Options{Settings: []string{"wal_level=replica", "max_wal_senders=4", "wal_retrieve_retry_interval=100ms"}})
	h.current = h.primary
	ctx := context.Background()
	for _, ddl := range []string{writesDDL, groupWritesDDL, leader.TermsTableSQL(leader.DefaultTermsTable)} {
		if err := h.primary.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
	}
	if cfg.Hostile {
		h.hostileSetup()
	}
	if cfg.Failover {
		st, err := h.primary.NewStandby()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		h.standby = st
		// Synchronous replication: what a failover that keeps committed
		// data needs. The electors commit their terms with
		// synchronous_commit=on.
		if err := h.primary.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = '*'"); err != nil {
			t.Fatal(err)
		}
		if err := h.primary.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
			t.Fatal(err)
		}
	}
	// Broken electors start first and take the lock, so that the checker
	// has something to catch; real electors then queue behind them.
	for i := 0; i < cfg.Broken; i++ {
		role := RoleBroken
		if cfg.Group {
			role = RoleGroupBroken
		}
		p := h.spawn(role)
		if i == 0 {
			if _, err := p.child.WaitTimeout("elected", 30*time.Second); err != nil {
				t.Fatalf("broken elector: %v", err)
			}
		}
	}
	for i := 0; i < cfg.Electors; i++ {
		h.spawn(h.role())
	}
	if h.standby != nil {
		h.spawnOn(h.role(), true)
	}
	if cfg.Hostile {
		stop, done := make(chan struct{}), make(chan struct{})
		go h.tenant(stop, done)
		h.schedule()
		close(stop)
		<-done
	} else {
		h.schedule()
	}
	h.finish()
	h.check()
	return h.report
}

func (h *harness) mono() int64 { return testpg.Mono() }

func (h *harness) note(ev, who string) {
	h.faultLog = append(h.faultLog, testpg.Event{Ev: ev, Identity: who, Mono: h.mono()})
}

func (h *harness) spawn(role string) *proc { return h.spawnOn(role, false) }

// role is the role of the processes under test.
func (h *harness) role() string {
	if h.cfg.Group {
		return RoleGroup
	}
	return RoleElector
}

// spawnOn starts an elector process. Its DSN lists the primary and the
// standby, each behind a proxy of its own: with target_session_attrs=
// read-write or with none (then DSN finds the primary itself), in turn; or,
// with standbyOnly, the standby alone.
func (h *harness) spawnOn(role string, standbyOnly bool) *proc {
	h.mu.Lock()
	h.seq++
	id := fmt.Sprintf("chaos-%d", h.seq)
	h.mu.Unlock()
	p := &proc{id: id, standbyOnly: standbyOnly}
	servers := []*testpg.Server{h.primary}
	if h.standby != nil {
		servers = append(servers, h.standby)
		if standbyOnly {
			servers = []*testpg.Server{h.standby}
		}
	}
	var hosts, ports []string
	for _, s := range servers {
		px, err := testpg.NewProxy(s.Addr())
		if err != nil {
			h.t.Fatal(err)
		}
		h.t.Cleanup(px.Close)
		p.proxies = append(p.proxies, px)
		host, port, _ := strings.Cut(px.Addr(), ":")
		hosts, ports = append(hosts, host), append(ports, port)
	}
	attrs := "&target_session_attrs=read-write"
	switch {
	case standbyOnly:
		attrs = ""
	case h.seq%2 == 0:
		attrs = ""
	}
	user := "postgres"
	if h.roles != nil {
		user = h.roles.App
	}
	dsn := fmt.Sprintf("postgres://%s@%s/postgres?sslmode=disable&connect_timeout=3%s", user, joinHostPorts(hosts, ports), attrs)
	prio := 0
	if h.cfg.Ranked {
		prio = h.seq % 3
	}
	p.child = testpg.StartChild(h.t, role, "CHAOS_DSN="+dsn, "CHAOS_ID="+id, "CHAOS_KEY="+h.key, fmt.Sprintf("CHAOS_KEYS=%d", h.cfg.Keys),
		fmt.Sprintf("CHAOS_PRIORITY=%d", prio))
	h.procs = append(h.procs, p)
	return p
}

func joinHostPorts(hosts, ports []string) string {
	var parts []string
	for i := range hosts {
		parts = append(parts, hosts[i]+":"+ports[i])
	}
	return strings.Join(parts, ",")
}

// openKeys returns the keys (Data; "" for a single elector) whose last
// tenure event in p's log is an election.
func openKeys(p *proc) map[string]bool {
	open := map[string]bool{}
	for _, e := range p.child.Log() {
		switch e.Ev {
		case "elected":
			open[e.Data] = true
		case "ctxdone", "demoted":
			delete(open, e.Data)
		case "exited":
			clear(open)
		}
	}
	return open
}

// leader returns a process that currently leads (in a group, a member
// that leads a key, at random) and can act.
func (h *harness) leader() *proc {
	var ls []*proc
	for _, p := range h.procs {
		if p.killed == 0 && len(openKeys(p)) > 0 {
			ls = append(ls, p)
		}
	}
	if len(ls) == 0 {
		return nil
	}
	if h.cfg.Group {
		return ls[h.rng.Intn(len(ls))]
	}
	return ls[0]
}

// led reports whether there is a leader: in a group, of every key.
func (h *harness) led() bool {
	if !h.cfg.Group {
		for _, p := range h.procs {
			if p.killed == 0 && len(openKeys(p)) > 0 {
				return true
			}
		}
		return false
	}
	all := map[string]bool{}
	for _, p := range h.procs {
		if p.killed == 0 {
			for k := range openKeys(p) {
				all[k] = true
			}
		}
	}
	return len(all) == h.cfg.Keys
}

// waitLeader waits up to bound for a leader (of every key, in a group); it
// returns how long it took.
func (h *harness) waitLeader(bound time.Duration) (time.Duration, bool) {
	began := time.Now()
	for time.Since(began) < bound {
		if h.led() {
			return time.Since(began), true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(began), false
}

func (h *harness) hold(lo, hi time.Duration) {
	time.Sleep(lo + time.Duration(h.rng.Int63n(int64(hi-lo))))
}

func (h *harness) schedule() {
	end := time.Now().Add(h.cfg.Duration)
	failoverAt := time.Now().Add(h.cfg.Duration * 7 / 10)
	if _, ok := h.waitLeader(30 * time.Second); !ok {
		h.report.Violations = append(h.report.Violations, "liveness: no first leader within 30s")
		return
	}
	for time.Now().Before(end) {
		fault := h.cfg.Faults[h.rng.Intn(len(h.cfg.Faults))]
		if h.cfg.Failover && h.standby != nil && h.current == h.primary && time.Now().After(failoverAt) {
			fault = "failover"
		}
		l := h.leader()
		if l == nil || !h.led() {
			if _, ok := h.waitLeader(10 * time.Second); !ok {
				h.report.Violations = append(h.report.Violations, "liveness: no leader before injecting "+fault)
				return
			}
			l = h.leader()
		}
		h.report.Faults[fault]++
		bound := Lease + Interval + 3*time.Second
		// One fault in four comes with a second one on a follower, healed
		// together with the first.
		heal2 := func() {}
		if f := h.follower(l); f != nil && h.rng.Intn(4) == 0 {
			heal2 = h.followerFault(f)
		}
		h.note("fault:"+fault, l.id)
		switch fault {
		case "kill":
			l.killed = h.mono()
			l.child.Signal(syscall.SIGKILL)
			h.hold(100*time.Millisecond, time.Second)
			h.spawn(h.role())
		case "pause", "long-pause":
			lo, hi := 200*time.Millisecond, Lease-300*time.Millisecond
			if fault == "long-pause" {
				lo, hi = Lease+200*time.Millisecond, 2*Lease
			}
			stop := h.mono()
			l.child.Pause()
			h.hold(lo, hi)
			l.child.Resume()
			l.stops = append(l.stops, [2]int64{stop, h.mono()})
		case "terminate":
			h.current.TerminateBackend(context.Background(), l.id)
		case "cut":
			for _, px := range l.proxies {
				px.Cut()
			}
		case "blackhole":
			for _, px := range l.proxies {
				px.Blackhole()
			}
			h.hold(200*time.Millisecond, 2*Lease)
			h.note(healCut, l.id)
			for _, px := range l.proxies {
				px.Heal()
			}
		case "restart-fast", "restart-immediate":
			mode := strings.TrimPrefix(fault, "restart-")
			if err := h.current.Restart(mode); err != nil {
				h.t.Fatalf("restart: %v", err)
			}
			bound = restartBound
		case "refuse":
			h.current.Stop(testpg.Fast)
			h.hold(time.Second, 3*time.Second)
			if err := h.current.StartAgain(); err != nil {
				h.t.Fatalf("start again: %v", err)
			}
			bound = restartBound
		case "failover":
			h.primary.Stop(testpg.Immediate)
			// From the promotion's request on, the standby may leave
			// recovery at any moment, before Promote's own polling sees
			// it; an election on it from then on is legitimate.
			h.promoted = h.mono()
			if err := h.standby.Promote(context.Background()); err != nil {
				h.t.Fatalf("promote: %v", err)
			}
			h.mu.Lock()
			h.current = h.standby
			h.mu.Unlock()
			bound = 10 * time.Second
		case "slow-drain":
			// OnElected keeps working for 2 to 3 leases after its context
			// ends, on a resign or on a graceful stop of its process: the
			// lock must stay held, renewed, until it returns.
			d := 2*Lease + time.Duration(h.rng.Int63n(int64(Lease)))
			h.report.Drains++
			l.child.Send("drain " + d.String())
			if h.rng.Intn(2) == 0 {
				l.child.Send("resign")
			} else {
				l.killed = h.mono()
				l.child.CloseStdin()
				h.spawn(h.role())
			}
			bound = d + 3*time.Second
		}
		if h.cfg.Group {
			// Liveness is every one of 100 keys led again: on the loaded
			// machine the last of a member's keys came up to 7 ms past
			// the elector's bounds (after a kill, and after a slow drain).
			bound += 2 * time.Second
		}
		heal2()
		h.note("healed:"+fault, l.id)
		took, ok := h.waitLeader(bound)
		h.report.Recovery[fault] = append(h.report.Recovery[fault], took)
		if !ok {
			h.report.Violations = append(h.report.Violations, fmt.Sprintf("liveness: no leader within %s after %s healed", bound, fault))
		}
		h.hold(100*time.Millisecond, 500*time.Millisecond)
	}
}

// follower picks a live, running process other than l.
func (h *harness) follower(l *proc) *proc {
	var fs []*proc
	for _, p := range h.procs {
		if p != l && p.killed == 0 {
			fs = append(fs, p)
		}
	}
	if len(fs) == 0 {
		return nil
	}
	return fs[h.rng.Intn(len(fs))]
}

// followerFault cuts, black-holes or pauses a follower, and returns what
// heals it.
func (h *harness) followerFault(f *proc) func() {
	kind := []string{"cut", "blackhole", "pause"}[h.rng.Intn(3)]
	h.report.Faults["follower-"+kind]++
	h.note("fault2:follower-"+kind, f.id)
	switch kind {
	case "cut":
		for _, px := range f.proxies {
			px.Cut()
		}
		return func() {}
	case "blackhole":
		for _, px := range f.proxies {
			px.Blackhole()
		}
		return func() {
			h.note(healCut, f.id)
			for _, px := range f.proxies {
				px.Heal()
			}
		}
	default:
		stop := h.mono()
		f.child.Pause()
		return func() {
			f.child.Resume()
			f.stops = append(f.stops, [2]int64{stop, h.mono()})
		}
	}
}

// finish stops every process (closing stdin) and waits for them.
func (h *harness) finish() {
	for _, p := range h.procs {
		if p.killed == 0 {
			p.child.Resume()
			p.child.CloseStdin()
		}
	}
	for _, p := range h.procs {
		select {
		case <-p.child.Done():
		case <-time.After(30 * time.Second):
			h.report.Violations = append(h.report.Violations, p.id+": did not exit within 30s of being asked")
			p.child.Signal(syscall.SIGKILL)
		}
	}
}

type tenure struct {
	id, key    string
	start, end int64
	term       int64
	graceful   bool // ended by a resign or a stop: lasts until OnElected returned
	// starved: a slow drain that lost its lock for a missed renew while
	// its process or server was starved (see starvedDrain).
	starved bool
}

// check runs every check the package doc names over the event logs and
// the database. Liveness is checked while the schedule runs.
func (h *harness) check() {
	keys := []string{""}
	if h.cfg.Group {
		keys = keys[:0]
		for i := range h.cfg.Keys {
			keys = append(keys, groupKeyName(h.key, i))
		}
	}
	var all []tenure
	for _, key := range keys {
		var tenures []tenure
		for _, p := range h.procs {
			h.checkCallbacks(p, key)
			tenures = append(tenures, h.tenuresOf(p, key)...)
		}
		sort.Slice(tenures, func(i, j int) bool { return tenures[i].start < tenures[j].start })
		h.checkSafety(tenures)
		h.checkTerms(tenures)
		all = append(all, tenures...)
	}
	for _, p := range h.procs {
		h.checkProcess(p)
		h.checkLeadersSeen(p)
	}
	h.report.Tenures = len(all)
	sort.Slice(all, func(i, j int) bool { return all[i].start < all[j].start })
	h.measureFailover(all)
	conn, err := h.current.Connect(context.Background())
	if err != nil {
		h.t.Fatal(err)
	}
	defer conn.Close(context.Background())
	h.checkWrites(conn)
	if !h.cfg.Group {
		h.checkHistory(conn, all)
	}
	h.checkSessions(conn)
}

// checkLeadersSeen checks that every leader an elector was told of
// (OnNewLeader) is one of the electors: no announcement another role
// forged may reach it.
func (h *harness) checkLeadersSeen(p *proc) {
	known := map[string]bool{}
	for _, q := range h.procs {
		known[q.id] = true
	}
	for _, e := range p.child.Log() {
		if e.Ev == "leaderseen" && !known[e.Data] {
			h.violate("leaders: %s was told %q leads", p.id, e.Data)
			return
		}
	}
}

// checkHistory compares the history table with the tenures: a row of a
// tenure's term names that tenure's elector.
func (h *harness) checkHistory(conn *pgx.Conn, tenures []tenure) {
	ctx := context.Background()
	classid, objid, objsubid := leader.KeyFromName(h.key).LockTag()
	rows, err := conn.Query(ctx, `SELECT term, holder, coalesce(reason, '') FROM pgleader_history WHERE classid = $1 AND objid = $2 AND objsubid = $3`, classid, objid, objsubid)
	if err != nil {
		h.violate("history: %v", err)
		return
	}
	holders := map[int64]string{}
	h.report.HistoryTerms = map[string]int{}
	for rows.Next() {
		var term int64
		var holder, reason string
		if err := rows.Scan(&term, &holder, &reason); err != nil {
			h.violate("history: %v", err)
			return
		}
		holders[term] = holder
		h.report.HistoryTerms[reason]++
	}
	rows.Close()
	for _, t := range tenures {
		switch got, ok := holders[t.term]; {
		case !ok:
			h.report.HistoryMissing++
		case got != t.id:
			h.violate("history: term %d names %s, but %s led it", t.term, got, t.id)
		}
	}
}

// keyNote names a group's key in a violation.
func keyNote(key string) string {
	if key == "" {
		return ""
	}
	return ", key " + key
}

func (h *harness) violate(format string, args ...any) {
	h.report.Violations = append(h.report.Violations, fmt.Sprintf(format, args...))
}

// tenuresOf reads p's tenures from its log. A tenure starts at OnElected.
// It ends when the belief ends (its context is cancelled) after a fault;
// after a graceful step-down (a resign, a stop, OnElected returning) the
// lock is kept until OnElected returns, so it ends then. A killed process's
// open tenure ends at the kill, and any tenure ends at a SIGSTOP: a
// stopped process acts only until it is stopped; the moments after it
// resumes and before it notices are the allowed exception, whose fenced
// writes must be refused (checkWrites).
func (h *harness) tenuresOf(p *proc, key string) []tenure {
	var out []tenure
	var cur *tenure
	for _, e := range p.child.Log() {
		if h.cfg.Group && e.Data != key && e.Ev != "exited" {
			continue
		}
		switch {
		case e.Ev == "elected":
			cur = &tenure{id: p.id, key: key, start: e.Mono, term: e.Term}
		case cur == nil:
		case e.Ev == "ctxdone" && (e.Err == "resigned" || e.Err == "stopped" || e.Err == "callback_returned"):
			cur.end, cur.graceful = e.Mono, true
		case e.Ev == "ctxdone" && !cur.graceful, e.Ev == "returned":
			cur.end = e.Mono
			cur.starved = cur.graceful && h.starvedDrain(p, cur.term, key)
			out = append(out, *cur)
			cur = nil
		}
	}
	if cur != nil { // killed while leading, or a broken elector
		cur.end = h.mono()
		if p.killed != 0 {
			cur.end = p.killed
		}
		out = append(out, *cur)
	}
	for i := range out {
		for _, s := range p.stops {
			if s[0] >= out[i].start && s[0] < out[i].end {
				out[i].end = s[0]
				break
			}
		}
	}
	return out
}

// starvedDrain reports whether p's slow drain of term (of key, in a
// group) lost its lock the way a paused process does: it was demoted for
// a missed renew (renew_deadline), and the process or its server was
// starved meanwhile (the child's 10 ms ticker, an elector's renew or a
// fenced write at least a renew interval late: starveWatch). There the
// contract promises no order, and fencing closes the window
// (checkWrites). A drain that
// loses its lock with nothing starved stays a violation: that is an
// elector, or a member, that stopped renewing.
func (h *harness) starvedDrain(p *proc, term int64, key string) bool {
	starved, demoted := false, false
	for _, e := range p.child.Log() {
		if e.Term != term || h.cfg.Group && e.Data != key {
			continue
		}
		switch e.Ev {
		case "returned":
			_, d := parseDrain(e.Data + " " + e.Err)
			starved = d >= Interval
		case "demoted":
			// An elector's drain ends in renew_deadline; a group member's
			// session, ended by a round's deadline, in connection_lost.
			demoted = e.Err == "renew_deadline" || h.cfg.Group && e.Err == "connection_lost"
		}
	}
	return starved && demoted
}

// demotedReason is the reason p's OnDemoted gave for term (of key, in a
// group), with its text when the child reported it (an elector's "why").
func (h *harness) demotedReason(p *proc, term int64, key string) string {
	reason := "none seen"
	for _, e := range p.child.Log() {
		switch {
		case e.Term != term:
		case e.Ev == "demoted" && (!h.cfg.Group || e.Data == key):
			reason = e.Err
		case e.Ev == "why" && !h.cfg.Group:
			reason += " (" + e.Err + ")"
		}
	}
	return reason
}

// drainRefused reports whether s is a slow drain's report with refused
// writes.
func drainRefused(s string) bool {
	n, _ := parseDrain(s)
	return strings.HasPrefix(s, "drain ") && n > 0
}

// parseDrain reads a slow drain's report ("drain refused=N", and
// "starved=D", in Data or Err): how many fenced writes were refused, and
// the worst stall seen meanwhile. -1 writes: no drain report.
func parseDrain(s string) (refused int, starved time.Duration) {
	refused = -1
	for _, f := range strings.Fields(s) {
		if v, ok := strings.CutPrefix(f, "refused="); ok {
			if n, err := strconv.Atoi(v); err == nil {
				refused = n
			}
		}
		if v, ok := strings.CutPrefix(f, "starved="); ok {
			if d, err := time.ParseDuration(v); err == nil {
				starved = d
			}
		}
	}
	return refused, starved
}

// checkCallbacks: exactly one OnDemoted per OnElected, never two OnElected
// in a row (a killed process may miss its last OnDemoted); per key in a
// group.
func (h *harness) checkCallbacks(p *proc, key string) {
	elected, demoted, open := 0, 0, false
	for _, e := range p.child.Log() {
		if h.cfg.Group && e.Data != key {
			continue
		}
		switch e.Ev {
		case "elected":
			if open {
				h.violate("callbacks: %s elected twice without a step-down%s", p.id, keyNote(key))
			}
			elected, open = elected+1, true
		case "demoted":
			demoted, open = demoted+1, false
		}
	}
	want := elected
	if p.killed != 0 && open {
		want--
	}
	if demoted != want && h.cfg.Broken == 0 {
		h.violate("callbacks: %s had %d OnElected and %d OnDemoted%s", p.id, elected, demoted, keyNote(key))
	}
}

// checkProcess: no goroutine leaked at exit, no refused write during a slow
// drain (the lock was kept), and no election while only a standby was
// reachable.
func (h *harness) checkProcess(p *proc) {
	for _, e := range p.child.Log() {
		switch {
		case e.Ev == "exited" && e.Data != "":
			h.violate("resources: %s leaked goroutines: %s", p.id, e.Data)
		case e.Ev == "returned" && !h.cfg.Group && drainRefused(e.Data) && !h.starvedDrain(p, e.Term, ""):
			h.violate("drain: %s (term %d): fenced writes refused during a slow drain (%s %s; demoted: %s): its lock was not kept", p.id, e.Term, e.Data, e.Err, h.demotedReason(p, e.Term, ""))
		case e.Ev == "returned" && h.cfg.Group && drainRefused(e.Err) && !h.starvedDrain(p, e.Term, e.Data):
			h.violate("drain: %s (key %s, term %d): fenced writes refused during a slow drain (%s; demoted: %s): its lock was not kept", p.id, e.Data, e.Term, e.Err, h.demotedReason(p, e.Term, e.Data))
		case e.Ev == "elected" && p.standbyOnly && (h.promoted == 0 || e.Mono < h.promoted):
			h.violate("standby: %s (term %d) was elected while it could reach only the standby", p.id, e.Term)
		}
	}
}

// measureFailover records, per fault, the time from its injection to the
// next election.
func (h *harness) measureFailover(tenures []tenure) {
	for _, f := range h.faultLog {
		if !strings.HasPrefix(f.Ev, "fault:") {
			continue
		}
		for _, t := range tenures {
			if t.start > f.Mono {
				name := strings.TrimPrefix(f.Ev, "fault:")
				h.report.Failover[name] = append(h.report.Failover[name], time.Duration(t.start-f.Mono))
				break
			}
		}
	}
}

// restartBound is the liveness bound after a server restart: every
// session is new, on a server whose caches are cold; on a loaded 2-core
// machine (the README's test command beside two CPU hogs) the first
// election took just over 5 s, the bound before.
const restartBound = 10 * time.Second

// healCut notes a black-hole's heal: it closes the black-holed
// connections (their streams lost bytes), which ends the sessions behind
// them on the server at once, a cut like any other. A black-hole shorter
// than the trust window is healed while its leader still trusts its lock.
const healCut = "heal-cut"

// serverEnded bounds, per fault, the overlap that only fencing can order:
// the lock is gone on the server before the old leader can know it.
//   - terminate, cut, follower-cut, and a black-hole's heal (healCut):
//     the server (or the network) ends the
//     session of that fault's target (in a group a "follower" leads keys
//     too); it reads the end from its socket a moment later.
//   - failover, restart-fast, restart-immediate, refuse: the server's locks
//     are gone with it (a promoted standby has none). A leader that sees its
//     connection break learns it at once; one cut off from the server at that
//     moment (a follower fault on it, in a group where every member leads)
//     learns it only when its trust window ends, RenewDeadline after its
//     last renew, while a candidate on the new primary can win at once.
var serverEnded = map[string]time.Duration{
	"terminate": 200 * time.Millisecond, "cut": 200 * time.Millisecond, "follower-cut": 200 * time.Millisecond,
	"failover": Deadline + 200*time.Millisecond, "restart-fast": Deadline + 200*time.Millisecond,
	"restart-immediate": Deadline + 200*time.Millisecond, "refuse": Deadline + 200*time.Millisecond,
}

// checkSafety: no tenure starts before the previous one ended, except when
// the server ended the old leader's session or lost its locks (see
// serverEnded): an overlap that only fencing orders, counted, and checked
// by checkWrites.
func (h *harness) checkSafety(tenures []tenure) {
	r := h.report
	var maxEnd int64
	var maxID string
	var maxStarved bool
	for i, t := range tenures {
		if i > 0 && t.start < maxEnd {
			overlap := time.Duration(maxEnd - t.start)
			if f := h.serverEndedBefore(t.start, maxID, overlap); f != "" {
				r.ServerEnded++
				r.MaxServerEnded = max(r.MaxServerEnded, overlap)
			} else if maxStarved {
				r.StarvedDrains++
			} else {
				h.violate("safety: %s (term %d%s) elected %s before %s stepped down (last fault: %s)", t.id, t.term, keyNote(t.key), overlap, maxID, h.faultBefore(t.start))
				if len(r.history) == 0 {
					h.history(t.start, t.key)
				}
			}
		}
		if t.end > maxEnd {
			maxEnd, maxID, maxStarved = t.end, t.id, t.starved
		}
	}
}

// checkTerms: each tenure's fencing term exceeds the previous tenure's.
func (h *harness) checkTerms(tenures []tenure) {
	for i := 1; i < len(tenures); i++ {
		if t := tenures[i]; t.term <= tenures[i-1].term {
			h.violate("fencing: term %d of %s%s does not exceed the previous tenure's %d", t.term, t.id, keyNote(t.key), tenures[i-1].term)
		}
	}
}

// checkWrites: no accepted write carries a term older than one accepted
// before it.
func (h *harness) checkWrites(conn *pgx.Conn) {
	ctx := context.Background()
	r := h.report
	if h.cfg.Group {
		conn.QueryRow(ctx, `SELECT count(*) FROM chaos_group_writes`).Scan(&r.Writes)
		conn.QueryRow(ctx, `SELECT count(*) FROM (SELECT term, max(term) OVER (PARTITION BY key ORDER BY id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before FROM chaos_group_writes) s WHERE term < before`).Scan(&r.Stale)
	} else {
		conn.QueryRow(ctx, `SELECT count(*) FROM chaos_writes`).Scan(&r.Writes)
		conn.QueryRow(ctx, `SELECT count(*) FROM (SELECT term, max(term) OVER (ORDER BY id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before FROM chaos_writes) s WHERE term < before`).Scan(&r.Stale)
	}
	if r.Stale > 0 {
		h.violate("fencing: %d writes with a stale term were accepted", r.Stale)
	}
}

// checkSessions: no session of any elector is left on the server.
func (h *harness) checkSessions(conn *pgx.Conn) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'chaos-%'`).Scan(&n)
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			h.violate("resources: %d elector sessions left on the server", n)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// serverEndedBefore names a fault, injected in the 5 s before mono, that
// explains an overlap with a tenure of member as a server-ended one (see
// serverEnded): a server-wide one (a restart, a failover), or one aimed at
// member's own sessions. "" when none does.
func (h *harness) serverEndedBefore(mono int64, member string, overlap time.Duration) string {
	for _, e := range h.faultLog {
		if e.Mono > mono || time.Duration(mono-e.Mono) > 5*time.Second {
			continue
		}
		kind, ok := strings.CutPrefix(e.Ev, "fault:")
		if !ok {
			kind, ok = strings.CutPrefix(e.Ev, "fault2:")
		}
		if !ok && e.Ev == healCut {
			kind, ok = "cut", true
		}
		if !ok {
			continue
		}
		bound := serverEnded[kind]
		if bound == 0 || overlap >= bound {
			continue
		}
		switch kind {
		case "terminate", "cut", "follower-cut":
			if e.Identity == member {
				return kind
			}
		default:
			return kind
		}
	}
	return ""
}

// faultBefore names the last fault injected before mono.
func (h *harness) faultBefore(mono int64) string {
	last := ""
	for _, e := range h.faultLog {
		if e.Mono <= mono && strings.HasPrefix(e.Ev, "fault:") {
			last = strings.TrimPrefix(e.Ev, "fault:")
		}
	}
	return last
}

// history keeps the merged event log around a moment, for the failure
// message.
func (h *harness) history(at int64, key string) {
	var all []testpg.Event
	for _, p := range h.procs {
		for _, e := range p.child.Log() {
			// In a group, the violating key's events and the members'
			// own (those that name no key); the others' hide them.
			if key == "" || e.Data == key || !strings.HasPrefix(e.Data, h.key+"/") {
				all = append(all, e)
			}
		}
	}
	all = append(all, h.faultLog...)
	sort.Slice(all, func(i, j int) bool { return all[i].Mono < all[j].Mono })
	for _, e := range all {
		if d := time.Duration(e.Mono - at); d > -5*time.Second && d < 5*time.Second {
			h.report.history = append(h.report.history, fmt.Sprintf("%+8.1fms %-10s %-10s term=%d %s %s", float64(d)/1e6, e.Identity, e.Ev, e.Term, e.Err, e.Data))
		}
	}
}

// Summary renders the report as a table.
func (r *Report) Summary() string {
	var b strings.Builder
	if r.Keys > 0 {
		fmt.Fprintf(&b, "group of %d keys: every check per key; liveness means every key led\n", r.Keys)
	}
	fmt.Fprintf(&b, "chaos seed %d: %d tenures, %d fenced writes accepted, %d stale accepted\n", r.Seed, r.Tenures, r.Writes, r.Stale)
	fmt.Fprintf(&b, "sessions or locks the server ended under a leader, overlapping the next one (fenced): %d, longest %s\n", r.ServerEnded, r.MaxServerEnded)
	fmt.Fprintf(&b, "slow drains (OnElected working 2-3 leases past its context, fenced writes throughout): %d; overlaps after a drain starved past its trust window (fenced): %d\n", r.Drains, r.StarvedDrains)
	if r.HistoryTerms != nil {
		var reasons []string
		for k, n := range r.HistoryTerms {
			if k == "" {
				k = "(leads)"
			}
			reasons = append(reasons, fmt.Sprintf("%s %d", k, n))
		}
		sort.Strings(reasons)
		fmt.Fprintf(&b, "history table: %s; tenures without a row: %d\n", strings.Join(reasons, ", "), r.HistoryMissing)
	}
	if r.Hostile != nil {
		var did []string
		for k, n := range r.Hostile {
			did = append(did, fmt.Sprintf("%s %d", k, n))
		}
		sort.Strings(did)
		fmt.Fprintf(&b, "hostile tenant (shadowed built-ins, forged notifications, squats in pgleader's lock space, a full lock table): %s\n", strings.Join(did, ", "))
	}
	fmt.Fprintf(&b, "%-18s %6s %14s %14s %14s\n", "fault", "count", "failover p50", "failover max", "healed->leader")
	var names []string
	for f := range r.Faults {
		names = append(names, f)
	}
	sort.Strings(names)
	quant := func(ds []time.Duration) (time.Duration, time.Duration) {
		ds = append([]time.Duration(nil), ds...)
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		if len(ds) == 0 {
			return 0, 0
		}
		return ds[len(ds)/2], ds[len(ds)-1]
	}
	for _, f := range names {
		p50, mx := quant(r.Failover[f])
		_, heal := quant(r.Recovery[f])
		fmt.Fprintf(&b, "%-18s %6d %14s %14s %14s\n", f, r.Faults[f], p50.Round(time.Millisecond), mx.Round(time.Millisecond), heal.Round(time.Millisecond))
	}
	b.WriteString("(failover: fault injected -> next OnElected; healed->leader: worst wait for a leader after the fault was healed)\n")
	fmt.Fprintf(&b, "invariants: safety, fencing (terms and writes), liveness, callback pairs, sessions and goroutines: ")
	if r.OK() {
		b.WriteString("all hold\n")
	} else {
		fmt.Fprintf(&b, "%d violations\n", len(r.Violations))
		for _, v := range r.Violations {
			b.WriteString("  " + v + "\n")
		}
		if len(r.history) > 0 {
			b.WriteString("history around the first safety violation (ms from it):\n")
			for _, l := range r.history {
				b.WriteString("  " + l + "\n")
			}
		}
	}
	test := "'TestChaos$'"
	switch {
	case r.Keys > 0 && r.Hostile != nil:
		test = "TestChaosGroupHostile"
	case r.Keys > 0:
		test = "'TestChaosGroup$'"
	case r.Hostile != nil:
		test = "TestChaosHostile"
	case r.Ranked:
		test = "TestChaosRanked"
	}
	fmt.Fprintf(&b, "reproduce: go test ./internal/harness/chaos -run %s -chaos.seed=%d\n", test, r.Seed)
	return b.String()
}
