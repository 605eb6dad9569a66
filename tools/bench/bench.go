package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"os"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgleader/pgleader/internal/harness/fleet"
	"github.com/pgleader/pgleader/internal/harness/pgtemp"
	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/leader"
)

// benchResult is one row of the bench table.
type benchResult struct {
	Scenario string    `json:"scenario"`
	Metric   string    `json:"metric"`
	Unit     string    `json:"unit"`
	Runs     int       `json:"runs"`
	P50      float64   `json:"p50"`
	P90      float64   `json:"p90"`
	P99      float64   `json:"p99"`
	Max      float64   `json:"max"`
	Min      float64   `json:"min"`
	Target   string    `json:"target,omitempty"`
	Values   []float64 `json:"values,omitempty"`
	// Interval95 is a ratio's 95 % interval (see ratioInterval).
	Interval95 []float64 `json:"interval_95,omitempty"`
}

type bencher struct {
	dsn string
	srv *pgtemp.Server // nil with --dsn
	exe string
	// groupSingle runs the group scenario without the crash watch.
	groupSingle bool
	runs        int
	out         io.Writer
	results     []benchResult
	admin       *pgx.Conn
	seq         int
	// short timings for the partition and pause scenarios
	interval, deadline, lease time.Duration
	// the crowd's timings (zero: the elector's defaults)
	crowd fleet.Options
	// settle overrides handoverFleet.settle (zero: its default).
	settle time.Duration
}

func cmdBench(args []string, stdout, stderr io.Writer) error {
	fs, dsn := newFlags("bench", "[--runs N] [--scenarios LIST] [--crowd N] [--idle D] [--json] [--dsn DSN --i-own-this-database]",
		`  go run ./tools/bench                               # every default scenario on a throwaway PostgreSQL
  go run ./tools/bench --scenarios resign,kill --runs 100
  go run ./tools/bench --dsn "$DSN" --i-own-this-database --scenarios resign,kill,backend --json
Scenarios: resign kill backend partition pause restart crowd freshness proclaim prefer
idle, dbload and group (not in the default list: they take minutes). partition,
pause and idle put a TCP proxy in front of the server; restart needs the
throwaway server.
`, stderr)
	runs := fs.Int("runs", 20, "runs per scenario")
	scen := fs.String("scenarios", "resign,kill,backend,partition,pause,restart,crowd,freshness,proclaim,prefer,idle", "comma-separated scenarios")
	crowd := fs.Int("crowd", 200, "candidates in the crowd scenario")
	crowdRuns := fs.Int("crowd-runs", 10, "runs per crowd handover kind")
	settle := fs.Duration("settle", 0, "how long resign and kill wait after an election before the next run (0: 100ms, the crowd's 1.5s); past RenewDeadline/2 (1.5s at the defaults) the heirs' waits are older than that at the handover, as at three handovers in four at a random moment")
	idle := fs.Duration("idle", time.Minute, "duration of the idle scenario")
	crowdInterval := fs.Duration("crowd-interval", 0, "RenewInterval of the crowd's candidates (0: the default, 1s); RenewDeadline and the lease scale with it")
	asJSON := fs.Bool("json", false, "print JSON")
	loadSizes := fs.String("dbload-sizes", "3,20,200", "fleet sizes of the dbload scenario (electors on one key, in this process; empty: none)")
	loadWindow := fs.Duration("dbload-window", 20*time.Second, "how long dbload measures each fleet's server CPU and log lines")
	loadSettle := fs.Duration("dbload-settle", 2*time.Second, "how long dbload lets each fleet stand before it measures its standing cost (a start has costs of its own)")
	loadPairs := fs.Int("dbload-pairs", 5, "alternated pgbench pairs (without, with the fleet) per fleet size")
	loadLeaders := fs.Int("dbload-leaders", 200, "leaders, each on a key of its own, for dbload's renew cost (0: skip)")
	loadKeyed := fs.Int("dbload-keyed", 100, "keys, each with 3 electors (a leader and two heirs), for dbload's cost of separate Electors per key (0: skip)")
	groupKeys := fs.Int("group-keys", 1000, "keys of the group scenario's kill, join and resign runs (3 members)")
	groupRuns := fs.Int("group-runs", 10, "kill-and-join runs of the group scenario (and three times as many resigns)")
	groupSingle := fs.Bool("group-single", false, "run the group scenario's members with SingleConnection (no crash watch), for comparison")
	groupResigns := fs.Int("group-resigns", 0, "resigns of the group scenario (0: three per kill-and-join run)")
	groupStanding := fs.Int("group-standing", 10000, "keys of the group scenario's standing cost (3 members; 0: skip)")
	groupWindow := fs.Duration("group-window", time.Minute, "how long the group scenario measures the standing group's server CPU")
	owned := fs.Bool("i-own-this-database", false, "allow --dsn: the bench writes to the database (pgbench tables, fencing terms) and starts and kills sessions there")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := checkTarget(dsn.get(), *owned, *scen); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	progress := stderr
	var sizes []int
	for _, f := range strings.Split(*loadSizes, ",") {
		if *loadSizes == "" {
			break // none: only the leaders' and the keys' fleets
		}
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return usageError{msg: fmt.Sprintf("--dbload-sizes: %q is not a fleet size", f)}
		}
		sizes = append(sizes, n)
	}
	maxConns := max(*crowd, slices.Max(append([]int{0}, sizes...)), *loadLeaders, 3**loadKeyed) + 40
	opts := pgtemp.Options{MaxConnections: maxConns}
	if strings.Contains(*scen, "group") {
		// The lock table must hold the largest group's keys twice over
		// (see group.LockTableError): max_locks_per_transaction ×
		// max_connections.
		perTx := max(64, (4*max(*groupStanding, *groupKeys)+maxConns-1)/maxConns)
		opts.Settings = append(opts.Settings, fmt.Sprintf("max_locks_per_transaction=%d", perTx))
	}
	return withDatabase(dsn.get(), progress, opts, func(dsn string, srv *pgtemp.Server) error {
		ctx := context.Background()
		admin, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return err
		}
		defer admin.Close(ctx)
		// What the numbers depend on besides the code: a handover's Go
		// processes hand off between goroutines, which costs more when
		// the runtime wakes an idle processor (docs/benchmarks.md, the
		// resign over fifteen runs); the candidates inherit GOMAXPROCS.
		var version string
		if err := admin.QueryRow(ctx, "SHOW server_version").Scan(&version); err != nil {
			return err
		}
		fmt.Fprintf(progress, "bench: %s, %d CPUs, GOMAXPROCS %d (the candidates inherit the environment's), PostgreSQL %s\n",
			runtime.Version(), runtime.NumCPU(), runtime.GOMAXPROCS(0), version)
		b := &bencher{dsn: dsn, srv: srv, exe: exe, runs: *runs, out: progress, admin: admin,
			interval: 100 * time.Millisecond, deadline: 500 * time.Millisecond, lease: 1500 * time.Millisecond, settle: *settle}
		if ci := *crowdInterval; ci > 0 {
			b.crowd = fleet.Options{Interval: ci, Deadline: 3 * ci, Lease: 6 * ci}
		}
		for _, s := range strings.Split(*scen, ",") {
			var err error
			fmt.Fprintf(progress, "bench: %s ...\n", s)
			switch strings.TrimSpace(s) {
			case "resign", "kill", "backend":
				err = b.handover(s, 3, b.runs)
			case "partition", "pause":
				err = b.silent(s)
			case "restart":
				err = b.restart()
			case "crowd":
				if err = b.handover("crowd-resign", *crowd, *crowdRuns); err == nil {
					err = b.handover("crowd-kill", *crowd, *crowdRuns)
				}
			case "idle":
				err = b.idle(*idle)
			case "freshness":
				err = b.freshness(*crowd, *crowdRuns)
			case "proclaim":
				err = b.proclaim(10, b.runs)
			case "prefer":
				err = b.prefer(b.runs)
			case "dbload":
				err = b.dbload(sizes, *loadLeaders, *loadKeyed, *loadWindow, *loadSettle, *loadPairs)
			case "group":
				resigns := *groupResigns
				if resigns == 0 {
					resigns = 3 * *groupRuns
				}
				b.groupSingle = *groupSingle
				err = b.group(*groupKeys, *groupRuns, resigns, *groupStanding, *groupWindow)
			default:
				return usageError{msg: fmt.Sprintf("unknown scenario %q", s)}
			}
			if err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
		}
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(b.results)
		}
		renderBench(stdout, b.results)
		return nil
	})
}

// checkTarget refuses a server that is not the bench's throwaway one unless
// the user says it is theirs to write to, and the scenarios that need the
// server's own processes or log on any such server.
func checkTarget(dsn string, owned bool, scenarios string) error {
	if dsn == "" {
		return nil
	}
	if !owned {
		return usageError{msg: "--dsn: the bench writes to the database it runs against (pgbench tables, fencing terms) and starts and kills sessions there; pass --i-own-this-database if this one is yours to use so, or leave --dsn out for a throwaway server"}
	}
	for _, s := range strings.Split(scenarios, ",") {
		switch strings.TrimSpace(s) {
		case "restart", "dbload", "group":
			return usageError{msg: fmt.Sprintf("scenario %s needs the bench's throwaway server (it restarts it, or reads its processes' CPU and its log)", s)}
		}
	}
	return nil
}

func renderBench(w io.Writer, rs []benchResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tmetric\truns\tp50\tp90\tp99\tmax\tunit\ttarget\t")
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.3f\t%.3f\t%.3f\t%.3f\t%s\t%s\t\n", r.Scenario, r.Metric, r.Runs, r.P50, r.P90, r.P99, r.Max, r.Unit, r.Target)
	}
	tw.Flush()
}

func (b *bencher) add(scenario, metric, unit, target string, vals []float64) {
	if len(vals) == 0 {
		return
	}
	s := append([]float64(nil), vals...)
	sort.Float64s(s)
	q := func(p float64) float64 { return s[min(len(s)-1, int(p*float64(len(s))))] }
	b.results = append(b.results, benchResult{Scenario: scenario, Metric: metric, Unit: unit, Runs: len(s),
		P50: q(0.5), P90: q(0.9), P99: q(0.99), Max: s[len(s)-1], Min: s[0], Target: target, Values: vals})
}

func ms(d int64) float64 { return float64(d) / 1e6 }

func (b *bencher) name(prefix string) string {
	b.seq++
	return fmt.Sprintf("pgleader-bench-%s-%d-%d", prefix, os.Getpid(), b.seq)
}

// handoverFleet is n candidate processes on one key, handing it over
// again and again.
type handoverFleet struct {
	b      *bencher
	kind   string
	n      int
	queued int // waiters in pg_locks before each run: the heirs, or every bare waiter
	key    leader.Key
	o      fleet.Options
	f      *fleet.Fleet
	next   int
	cur    fleet.Event
	settle time.Duration // from one election to the next run's start
}

// newHandoverFleet starts n candidates (bare: pg_advisory_lock waiters,
// the reference) and waits for the first election.
func (b *bencher) newHandoverFleet(kind string, n int, bare bool) (*handoverFleet, error) {
	name := b.name(kind)
	h := &handoverFleet{b: b, kind: kind, n: n, key: leader.KeyFromName(name), f: fleet.New(b.exe),
		o: fleet.Options{DSN: b.dsn, Key: name, Bare: bare}, queued: min(n-1, lockconn.DefaultHeirs)}
	if bare {
		h.queued = n - 1
	}
	// Each run starts once the fleet has settled after the last election:
	// the resigned or replaced candidate has rejoined and, in a crowd, the
	// announcement has woken every follower and the watchers' early polls
	// (within an heir's wait, 0.8 × deadlock_timeout) are over. Back-to-back
	// handovers measure that wake-up instead of the handover.
	h.settle = 100 * time.Millisecond
	if strings.HasPrefix(kind, "crowd") {
		h.settle = 1500 * time.Millisecond
		h.o.Interval, h.o.Deadline, h.o.Lease = b.crowd.Interval, b.crowd.Deadline, b.crowd.Lease
	}
	if b.settle > 0 {
		h.settle = b.settle
	}
	for i := 0; i < n; i++ {
		if err := h.add(); err != nil {
			h.f.StopAll()
			return nil, err
		}
	}
	var err error
	if h.cur, err = h.f.Next("elected", time.Minute); err != nil {
		h.f.StopAll()
		return nil, err
	}
	return h, nil
}

func (h *handoverFleet) add() error {
	h.next++
	o := h.o
	o.ID = fmt.Sprintf("c%d", h.next)
	_, err := h.f.Add(o)
	return err
}

// once hands the key over once and returns how long it took, in ms: from
// the resign command, the SIGKILL or pg_terminate_backend to the next
// candidate's "elected".
func (h *handoverFleet) once(kind string) (took float64, err error) {
	b := h.b
	if d := h.settle - time.Duration(fleet.Mono()-h.cur.Mono); d > 0 {
		time.Sleep(d)
	}
	if err := waitQueued(context.Background(), b.admin, h.key, h.queued); err != nil {
		return 0, err
	}
	if !h.o.Bare {
		if err := waitStanding(context.Background(), b.admin, h.key, h.n); err != nil {
			return 0, err
		}
	}
	began := fleet.Mono()
	switch kind {
	case "resign", "crowd-resign":
		err = h.f.Get(h.cur.Identity).Send("resign")
	case "kill", "crowd-kill":
		c := h.f.Get(h.cur.Identity)
		h.f.Remove(h.cur.Identity)
		began = fleet.Mono()
		err = c.Signal(syscall.SIGKILL)
		// The replacement starts after the handover, so that its start
		// does not compete with it for the CPU.
		defer func() {
			if err == nil {
				err = h.add()
			}
		}()
	case "backend":
		_, err = b.admin.Exec(context.Background(), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", h.cur.Identity)
	}
	if err != nil {
		return 0, err
	}
	nxt, err := h.f.Next("elected", time.Minute, h.cur.Identity)
	if err != nil {
		return 0, err
	}
	h.cur = nxt
	return ms(nxt.Mono - began), nil
}

// waitStanding waits until n candidates of key stand by: they hold its
// roster lock (see lockconn.Quiet), connected and set up.
func waitStanding(ctx context.Context, conn *pgx.Conn, key leader.Key, n int) error {
	roster := lockconn.NewTarget(key, "", "", "").Roster()
	deadline := time.Now().Add(queueTimeout)
	for {
		var got int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = $1 AND objid = $2 AND objsubid = 2 AND granted`,
			uint32(lockconn.Space), uint32(roster)).Scan(&got)
		if err != nil {
			return err
		}
		if got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d candidates stand by after %s", got, n, queueTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// handover measures resign, kill and backend handovers with n candidates.
// A resign or a kill with 3 candidates alternates, run by run, with the
// same handover between bare pg_advisory_lock waiters (each in a process
// of its own, as the candidates are: a kill ends a process either way),
// the speed of a lock grant itself, and reports the ratio of the two
// medians with its 95 % interval.
func (b *bencher) handover(kind string, n, runs int) error {
	h, err := b.newHandoverFleet(kind, n, false)
	if err != nil {
		return err
	}
	defer h.f.StopAll()
	var ref *handoverFleet
	if kind == "resign" || kind == "kill" {
		if ref, err = b.newHandoverFleet("bare-"+kind, n, true); err != nil {
			return err
		}
		defer ref.f.StopAll()
	}
	var vals, refVals []float64
	for run := 0; run < runs; run++ {
		v, err := h.once(kind)
		if err != nil {
			return err
		}
		vals = append(vals, v)
		if ref != nil {
			v, err := ref.once(kind)
			if err != nil {
				return fmt.Errorf("bare reference: %w", err)
			}
			refVals = append(refVals, v)
		}
	}
	target := map[string]string{"resign": "p99 <= 5", "kill": "p99 <= 50", "backend": "p99 <= 50",
		"crowd-resign": "p99 <= 5", "crowd-kill": "p99 <= 50"}[kind]
	b.add(kind, fmt.Sprintf("handover (%d candidates)", n), "ms", target, vals)
	if ref != nil {
		b.add(kind, fmt.Sprintf("bare pg_advisory_lock (%d waiters, reference)", n), "ms", "", refVals)
		lo, hi := ratioInterval(vals, refVals)
		b.add(kind, fmt.Sprintf("p50 / bare p50 (95 %% interval %.2f-%.2f)", lo, hi), "x",
			map[string]string{"resign": "<= 1.2", "kill": "<= 1.5"}[kind], []float64{median(vals) / median(refVals)})
		b.results[len(b.results)-1].Interval95 = []float64{lo, hi}
	}
	return nil
}

// ratioInterval is a bootstrap 95 % interval of median(a) / median(b):
// both samples resampled with replacement, each on its own, 2,000 times
// (the runs alternate, so a drift of the machine's speed is in both).
func ratioInterval(a, b []float64) (lo, hi float64) {
	const n = 2000
	r := rand.New(rand.NewPCG(uint64(len(a)), uint64(len(b))))
	rs := make([]float64, n)
	ra, rb := make([]float64, len(a)), make([]float64, len(b))
	for i := range rs {
		for j := range ra {
			ra[j] = a[r.IntN(len(a))]
		}
		for j := range rb {
			rb[j] = b[r.IntN(len(b))]
		}
		rs[i] = median(ra) / median(rb)
	}
	slices.Sort(rs)
	return rs[n*25/1000], rs[n*975/1000-1]
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// proxyDSN points dsn at addr instead of its own host and port.
func proxyDSN(dsn, addr string) (string, error) {
	host, port, _ := strings.Cut(addr, ":")
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", err
		}
		u.Host = addr
		return u.String(), nil
	}
	return dsn + " host=" + host + " port=" + port, nil
}

func serverAddr(dsn string) (string, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return "", err
	}
	if strings.HasPrefix(cfg.Host, "/") {
		return "", errors.New("the DSN uses a Unix socket; the proxy needs TCP")
	}
	return cfg.Host + ":" + strconv.Itoa(int(cfg.Port)), nil
}

// proxiedFleet starts n candidates for name, each connecting through its
// own TCP proxy in front of the server; o carries their timings.
func (b *bencher) proxiedFleet(name string, n int, o fleet.Options) (*fleet.Fleet, map[string]*pgtemp.Proxy, error) {
	proxies := map[string]*pgtemp.Proxy{}
	f := fleet.New(b.exe)
	target, err := serverAddr(b.dsn)
	for i := 0; err == nil && i < n; i++ {
		var p *pgtemp.Proxy
		if p, err = pgtemp.NewProxy(target); err != nil {
			break
		}
		o.ID, o.Key = fmt.Sprintf("p%d", i), name
		proxies[o.ID] = p
		if o.DSN, err = proxyDSN(b.dsn, p.Addr()); err == nil {
			_, err = f.Add(o)
		}
	}
	if err != nil {
		closeProxied(f, proxies)
		return nil, nil, err
	}
	return f, proxies, nil
}

func closeProxied(f *fleet.Fleet, proxies map[string]*pgtemp.Proxy) {
	f.StopAll()
	for _, p := range proxies {
		p.Close()
	}
}

// silent measures a partitioned (black-holed) or paused (SIGSTOP) leader:
// the time from its last successful renew to the new leader's election,
// and the margin between the old leader's step-down and that election.
func (b *bencher) silent(kind string) error {
	name := b.name(kind)
	key := leader.KeyFromName(name)
	f, proxies, err := b.proxiedFleet(name, 3, fleet.Options{Interval: b.interval, Deadline: b.deadline, Lease: b.lease, Renews: true})
	if err != nil {
		return err
	}
	defer closeProxied(f, proxies)
	// Track each candidate's last renew from the event stream.
	lastRenew := map[string]int64{}
	nextOf := func(ev string, skip string) (fleet.Event, error) {
		timeout := time.After(time.Minute)
		for {
			select {
			case e := <-f.Events:
				if e.Ev == "renewed" {
					lastRenew[e.Identity] = e.Mono
				}
				if e.Ev == ev && e.Identity != skip {
					return e, nil
				}
			case <-timeout:
				return fleet.Event{}, fmt.Errorf("no %s event", ev)
			}
		}
	}
	cur, err := nextOf("elected", "")
	if err != nil {
		return err
	}
	var takeover, margin []float64
	for run := 0; run < b.runs; run++ {
		if err := waitQueued(context.Background(), b.admin, key, 2); err != nil {
			return err
		}
		old := cur.Identity
		if kind == "partition" {
			proxies[old].Blackhole()
		} else {
			if err := f.Get(old).Pause(); err != nil {
				return err
			}
		}
		var stepped int64
		if kind == "partition" {
			ctxdone, err := nextOf("ctxdone", "")
			if err != nil {
				return err
			}
			stepped = ctxdone.Mono
		}
		nxt, err := nextOf("elected", old)
		if err != nil {
			return err
		}
		if kind == "pause" {
			// A stopped process cannot step down; its trust window
			// (IsLeader) ends RenewDeadline after its last renew.
			stepped = lastRenew[old] + int64(b.deadline)
			f.Get(old).Resume()
		} else {
			proxies[old].Heal()
		}
		takeover = append(takeover, ms(nxt.Mono-lastRenew[old]))
		margin = append(margin, ms(nxt.Mono-stepped))
		cur = nxt
	}
	bound := fmt.Sprintf("<= %d (lease + interval)", (b.lease + b.interval).Milliseconds())
	b.add(kind, "last renew -> new leader", "ms", bound, takeover)
	m := "old leader stepped down -> new leader"
	if kind == "pause" {
		m = "old trust window ended -> new leader"
	}
	b.add(kind, m, "ms", ">= 0 every run", margin)
	return nil
}

// restart measures the time from the server accepting connections after a
// fast or immediate restart to a leader again.
func (b *bencher) restart() error {
	if b.srv == nil {
		fmt.Fprintln(b.out, "bench: restart needs the throwaway server (no --dsn); skipped")
		return nil
	}
	for _, mode := range []string{pgtemp.Fast, pgtemp.Immediate} {
		name := b.name("restart")
		f := fleet.New(b.exe)
		for i := 0; i < 3; i++ {
			if _, err := f.Add(fleet.Options{DSN: b.dsn, Key: name, ID: fmt.Sprintf("r%d", i)}); err != nil {
				return err
			}
		}
		if _, err := f.Next("elected", time.Minute); err != nil {
			return err
		}
		var vals []float64
		for run := 0; run < b.runs; run++ {
			b.admin.Close(context.Background())
			if err := b.srv.Restart(mode); err != nil {
				return err
			}
			up := fleet.Mono()
			e, err := f.Next("elected", time.Minute)
			if err != nil {
				return err
			}
			vals = append(vals, ms(e.Mono-up))
			if b.admin, err = pgx.Connect(context.Background(), b.dsn); err != nil {
				return err
			}
		}
		f.StopAll()
		b.add("restart-"+mode, "server accepts -> leader", "ms", "<= 1000", vals)
	}
	return nil
}

// idle measures what standing by costs: round trips, bytes, CPU and heap
// of one leader and two followers (default timings) over d.
func (b *bencher) idle(d time.Duration) error {
	name := b.name("idle")
	f, proxies, err := b.proxiedFleet(name, 3, fleet.Options{})
	if err != nil {
		return err
	}
	defer closeProxied(f, proxies)
	lead, err := f.Next("elected", time.Minute)
	if err != nil {
		return err
	}
	if err := waitQueued(context.Background(), b.admin, leader.KeyFromName(name), 2); err != nil {
		return err
	}
	type snap struct{ reads, bytes, cpu int64 }
	take := func() (map[string]snap, error) {
		m := map[string]snap{}
		for id, p := range proxies {
			f.Get(id).Send("stats")
			m[id] = snap{reads: p.ReadsUp.Load(), bytes: p.BytesUp.Load() + p.BytesDown.Load()}
		}
		for range proxies {
			e, err := f.Next("stats", 10*time.Second)
			if err != nil {
				return nil, err
			}
			var heap, cpu int64
			fmt.Sscan(e.Data, &heap, &cpu)
			s := m[e.Identity]
			s.cpu = cpu
			m[e.Identity] = s
		}
		return m, nil
	}
	before, err := take()
	if err != nil {
		return err
	}
	began := time.Now()
	time.Sleep(d)
	after, err := take()
	if err != nil {
		return err
	}
	secs := time.Since(began).Seconds()
	for _, role := range []string{"leader", "follower"} {
		var rts, bytes, cpu []float64
		for id := range proxies {
			if (id == lead.Identity) != (role == "leader") {
				continue
			}
			rts = append(rts, float64(after[id].reads-before[id].reads)/secs)
			bytes = append(bytes, float64(after[id].bytes-before[id].bytes)/secs)
			cpu = append(cpu, float64(after[id].cpu-before[id].cpu)/1e6/secs)
		}
		b.add("idle-"+role, "round trips per second", "1/s", "<= 1 (interval 1s)", rts)
		b.add("idle-"+role, "bytes on the wire per second", "B/s", "", bytes)
		b.add("idle-"+role, "CPU per second", "ms/s", "", cpu)
	}
	return nil
}
