package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/leader"
)

// lockStatus is one advisory lock: its holder and its waiters.
type lockStatus struct {
	Key    string         `json:"key"`
	Name   string         `json:"name,omitempty"`
	Holder *sessionStatus `json:"holder"`
	// Sharers hold the lock in share mode: no leader, but nobody can
	// take it exclusively while they do.
	Sharers []sessionStatus `json:"sharers,omitempty"`
	Waiters []sessionStatus `json:"waiters"`
	// Watching are the candidates that stand by without queueing (an
	// elector's watchers, seen in the key's roster; see lockconn.Quiet).
	Watching []sessionStatus `json:"watching"`
	Term     int64           `json:"term,omitempty"`
	// LastHandover: the newest term's start, from the history table.
	LastHandover *handover `json:"last_handover,omitempty"`
	// Group names the group.Group whose member holds the key.
	Group string `json:"group,omitempty"`
	// Why says why the holder leads, when it or a candidate is ranked (see
	// rankWhy): "preferred (...)", "a preferred candidate stands (...)" or
	// "first come".
	Why   string   `json:"why,omitempty"`
	order [3]int64 // key space, then the key's value(s): numeric order
}

// handover is a key's newest term, and how the one before it ended.
type handover struct {
	At     time.Time `json:"at"`
	From   string    `json:"from,omitempty"`
	To     string    `json:"to"`
	Reason string    `json:"reason,omitempty"` // why From's term ended
}

type sessionStatus struct {
	Identity string `json:"identity"`
	// Rank is a ranked candidate's, from its application_name (see
	// leader.Rank).
	Rank *rankStatus `json:"rank,omitempty"`
	PID  uint32      `json:"pid"`
	User string      `json:"user"`
	// HeldSince is when the lock was granted, known from the fencing terms
	// table; otherwise the session's start (an upper bound), and
	// HeldSinceExact is false.
	HeldSince      *time.Time `json:"held_since,omitempty"`
	HeldSinceExact bool       `json:"held_since_exact"`
	// WaitingSince is when a waiter's current lock wait started
	// (PostgreSQL 14+). An elector's wait restarts every round, so for
	// its candidates StandingSince tells more.
	WaitingSince *time.Time `json:"waiting_since,omitempty"`
	// StandingSince is when a pgleader candidate's session started: it
	// has stood for the key since (it joins the key's roster at connect).
	StandingSince *time.Time `json:"standing_since,omitempty"`
	// Value is the value a holder proclaimed (elector.Config.Value), from
	// the values table, when it is text; ValueBase64 when it is not.
	// Only a row the holder's own session wrote (its pid, session start
	// and identity) counts.
	Value       *string `json:"value,omitempty"`
	ValueBase64 []byte  `json:"value_base64,omitempty"`
	started     *time.Time
	app         string // the application_name, rank and all
}

// rankStatus is a ranked candidate's rank.
type rankStatus struct {
	Strategy string `json:"strategy"`
	Priority int    `json:"priority"`
	Version  string `json:"version,omitempty"`
	rank     leader.Rank
}

// parseApp sets s's identity and rank from its application_name.
func (s *sessionStatus) parseApp(app string) {
	s.app = app
	s.Identity, s.Rank = splitApp(app)
}

// splitApp returns the identity an application_name carries, and the
// rank when it carries one (see leader.Rank).
func splitApp(app string) (string, *rankStatus) {
	id, r, ok := leader.ParseApplicationName(app)
	if !ok {
		return app, nil
	}
	return id, &rankStatus{Strategy: r.Strategy.String(), Priority: r.Priority, Version: r.Version, rank: r}
}

// label is the session's identity, and its rank when it has one, for
// text.
func (s *sessionStatus) label() string { return label(s.Identity, s.Rank) }

// label is identity, and r when it is not nil, for text.
func label(identity string, r *rankStatus) string {
	if r == nil {
		return show(identity)
	}
	return show(identity) + " " + strings.TrimPrefix(r.rank.ApplicationName(""), " ")
}

// rankWhy says why the holder of ls leads, when it or a candidate is
// ranked ("" when none is): the holder prefers candidates by its own
// strategy, an unranked one ByPriority at priority 0, as an elector does.
func rankWhy(ls *lockStatus) string {
	h := ls.Holder
	if h == nil {
		return ""
	}
	ranked := h.Rank != nil
	var mine leader.Rank
	if ranked {
		mine = h.Rank.rank
	}
	var best *sessionStatus
	var bestRank leader.Rank
	for _, group := range [][]sessionStatus{ls.Waiters, ls.Watching} {
		for i := range group {
			c := &group[i]
			var r leader.Rank
			if c.Rank != nil {
				ranked, r = true, c.Rank.rank
			}
			if best == nil || leader.Compare(mine.Strategy, r.Preference, bestRank.Preference) > 0 {
				best, bestRank = c, r
			}
		}
	}
	switch {
	case !ranked:
		return ""
	case best == nil:
		return "first come (no candidate stands)"
	}
	switch leader.Compare(mine.Strategy, mine.Preference, bestRank.Preference) {
	case 1:
		return "preferred (" + rankReason(mine.Strategy, mine.Preference, bestRank.Preference) + ")"
	case -1:
		return "a preferred candidate stands: " + best.label() + " (" + rankReason(mine.Strategy, bestRank.Preference, mine.Preference) + "); the leader hands over after its PreferredDelay"
	}
	return "first come"
}

// rankReason says why a is preferred to b under s.
func rankReason(s leader.Strategy, a, b leader.Preference) string {
	if (s == leader.NewestVersion || s == leader.OldestVersion) && leader.CompareVersions(a.Version, b.Version) != 0 {
		return fmt.Sprintf("%s: version %q over %q", s, a.Version, b.Version)
	}
	return fmt.Sprintf("%s: priority %d over %d", s, a.Priority, b.Priority)
}

func cmdStatus(args []string, stdout, stderr io.Writer) error {
	fs, dsn := newFlags("status", "status [--dsn DSN] [--json] [--watch] [--interval D] [--name NAME]... [--terms-table T] [--serve ADDR] [-n N NAME | NAME]",
		`  pgleader status                         # who holds what, who waits
  pgleader status billing-consumer        # one election; exit 3 when nobody leads it
  pgleader status -n 3 backfill           # a semaphore's slots (elect -n, lock -n); exit 3 when none is led
  pgleader status --json | jq .           # machine-readable
  pgleader status --watch                 # redraw on every change
  pgleader status --name billing-consumer # show this name for its key
  pgleader status --serve 127.0.0.1:8080  # a live, read-only page for the whole database
`, stderr)
	asJSON := fs.Bool("json", false, "print JSON")
	watch := fs.Bool("watch", false, "redraw whenever the locks change")
	interval := fs.Duration("interval", time.Second, "poll interval for --watch; the --serve page refreshes every 2s or this, the longer")
	table := fs.String("terms-table", leader.DefaultTermsTable, "fencing terms table to read names, terms and election times from, if it exists")
	valuesTable := fs.String("values-table", leader.DefaultValuesTable, "values table to read leaders' values from (elector.Config.Value), if it exists")
	serve := fs.String("serve", "", "serve a live read-only HTML page on this address instead of printing")
	slots := fs.Int("n", 1, "with NAME: the N slots of a semaphore (elect -n, lock -n), NAME and NAME#1 to NAME#N-1")
	var names multiFlag
	fs.Var(&names, "name", "a lock name to recognise (repeatable)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := needDSN(dsn.get()); err != nil {
		return err
	}
	var only []string // status NAME: one election, or a semaphore's slots
	switch {
	case *slots < 1 || *slots > maxSlots:
		return usageError{msg: fmt.Sprintf("-n must be between 1 and %d", maxSlots)}
	case fs.NArg() == 0 && *slots > 1:
		return usageError{msg: "-n needs a NAME"}
	case fs.NArg() == 1:
		for i := range *slots {
			only = append(only, slotName(fs.Arg(0), i))
		}
		names = append(names, only...)
	case fs.NArg() > 1:
		return usageError{msg: "status takes at most one NAME"}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *serve != "" {
		known := map[string]string{}
		for _, n := range names {
			known[leader.KeyFromLockTag(leader.KeyFromName(n).LockTag()).String()] = n
		}
		return servePage(ctx, dsn.get(), *serve, known, max(*interval, 2*time.Second), func(addr string) {
			fmt.Fprintf(stderr, "pgleader status: serving the live page on http://%s/\n", addr)
		})
	}
	conn, schemas, err := dial(ctx, dsn.get())
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	known := map[string]string{} // key (as numbers) -> name
	for _, n := range names {
		known[leader.KeyFromLockTag(leader.KeyFromName(n).LockTag()).String()] = n
	}
	last := ""
	tty := isTerminal(stdout)
	for {
		locks, err := readStatus(ctx, conn, tables{terms: optional(ctx, conn, schemas, *table),
			history: optional(ctx, conn, schemas, leader.DefaultHistoryTable), values: optional(ctx, conn, schemas, *valuesTable)}, known)
		var groups []*groupView
		if err == nil {
			groups, err = readGroups(ctx, conn, locks)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		var out strings.Builder
		leaderless := false
		switch {
		case len(only) > 0:
			leaderless = renderOnly(&out, locks, only, *asJSON)
		case *asJSON:
			b, _ := json.MarshalIndent(locks, "", "  ")
			out.Write(b)
			out.WriteString("\n")
		default:
			renderGroups(&out, groups)
			if rest := ungrouped(locks); len(rest) > 0 || len(groups) == 0 {
				renderStatus(&out, rest)
			}
		}
		if !*watch {
			fmt.Fprint(stdout, out.String())
			if leaderless {
				return exitCode(exitNoLeader)
			}
			return nil
		}
		if s := out.String(); s != last {
			if tty {
				fmt.Fprint(stdout, "\x1b[H\x1b[2J"+time.Now().Format(time.TimeOnly)+"\n"+s)
			} else {
				// A pipe or a file: no screen codes, one block per change.
				fmt.Fprint(stdout, "--- "+time.Now().Format(time.TimeOnly)+"\n"+s)
			}
			last = s
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(*interval):
		}
	}
}

// maxSlots bounds status -n (lock.MaxSlots: elect -n allows fewer).
const maxSlots = 1024

// slotName is the name of slot i of the semaphore name (leader.SlotKey):
// name itself for slot 0.
func slotName(name string, i int) string {
	if i == 0 {
		return name
	}
	return name + "#" + strconv.Itoa(i)
}

// renderOnly renders status NAME: one election, or each slot of a
// semaphore (-n), as text or JSON (an object for one, an array of slots).
// It reports whether nothing is led.
func renderOnly(out *strings.Builder, locks []*lockStatus, only []string, asJSON bool) (leaderless bool) {
	var ls []*lockStatus
	leaderless = true
	waiting, watching := 0, 0
	for _, name := range only {
		l := pick(locks, leader.KeyFromName(name), name)
		ls = append(ls, l)
		leaderless = leaderless && l.Holder == nil
		waiting, watching = waiting+len(l.Waiters), watching+len(l.Watching)
	}
	switch {
	case asJSON:
		var b []byte
		if len(ls) == 1 {
			b, _ = json.MarshalIndent(ls[0], "", "  ")
		} else {
			b, _ = json.MarshalIndent(ls, "", "  ")
		}
		out.Write(b)
		out.WriteString("\n")
	case leaderless && len(ls) == 1:
		l := ls[0]
		fmt.Fprintf(out, "%s: NO LEADER (%d waiting, %d watching)\n", only[0], len(l.Waiters), len(l.Watching))
		if len(l.Sharers) > 0 {
			fmt.Fprintf(out, "held shared by %s: nobody can be elected until they let go\n", sessionList(l.Sharers))
		}
	case leaderless:
		fmt.Fprintf(out, "%s: NO SLOT LED (%d slots; %d waiting, %d watching)\n", only[0], len(ls), waiting, watching)
	default:
		renderStatus(out, ls)
		for _, l := range ls {
			if h := l.Holder; h != nil && h.Value != nil {
				fmt.Fprintf(out, "value of %s: %s\n", show(h.Identity), strconv.QuoteToGraphic(*h.Value))
			} else if h != nil && h.ValueBase64 != nil {
				fmt.Fprintf(out, "value of %s: %d bytes, not text (see --json)\n", show(h.Identity), len(h.ValueBase64))
			}
		}
	}
	return leaderless
}

// pick returns the status of key (named name), or an empty one when no
// session holds or awaits it.
func pick(locks []*lockStatus, key leader.Key, name string) *lockStatus {
	plain := leader.KeyFromLockTag(key.LockTag()).String() // as the rows name it: numbers only
	for _, l := range locks {
		if l.Key == plain {
			return l
		}
	}
	return &lockStatus{Key: plain, Name: name, Waiters: []sessionStatus{}, Watching: []sessionStatus{}}
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// tables are pgleader's tables as a command found them (see readable):
// quoted names, "" for none.
type tables struct{ terms, history, values string }

func readStatus(ctx context.Context, conn *pgx.Conn, tbl tables, known map[string]string) ([]*lockStatus, error) {
	waitstart := "NULL::timestamptz"
	if lockconn.ServerMajor(conn) >= 14 {
		waitstart = "l.waitstart"
	}
	rows, err := conn.Query(ctx, `SELECT l.classid, l.objid, l.objsubid, l.granted, l.pid,
  coalesce(a.application_name, ''), coalesce(a.usename::text, ''), a.backend_start, `+waitstart+`, l.mode, coalesce(a.query, '')
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.database = (SELECT datid FROM pg_stat_activity WHERE pid = pg_backend_pid())
ORDER BY l.classid, l.objid, l.objsubid, l.granted DESC, a.backend_start, l.pid`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	byKey := map[leader.Key]*lockStatus{}
	rosters := map[int32][]sessionStatus{}
	var order []*lockStatus
	for rows.Next() {
		var classid, objid uint32
		var objsubid int16
		var granted bool
		var pid int32
		var s sessionStatus
		var start, wait *time.Time
		var app, mode, query string
		if err := rows.Scan(&classid, &objid, &objsubid, &granted, &pid, &app, &s.User, &start, &wait, &mode, &query); err != nil {
			return nil, err
		}
		s.parseApp(app)
		s.PID, s.started = uint32(pid), start
		if int32(classid) == lockconn.Space && objsubid == 2 {
			// A roster or an heir slot: pgleader's own bookkeeping, shown
			// with the key it belongs to below.
			if !granted || mode != "ShareLock" {
				continue
			}
			rosters[int32(objid)] = append(rosters[int32(objid)], s)
			continue
		}
		k := leader.KeyFromLockTag(classid, objid, objsubid)
		ls := byKey[k]
		if ls == nil {
			ls = &lockStatus{Key: k.String(), Name: known[k.String()], Waiters: []sessionStatus{},
				order: [3]int64{int64(objsubid), int64(int32(classid)), int64(int32(objid))}}
			if objsubid == 1 {
				ls.order = [3]int64{1, int64(classid)<<32 | int64(objid), 0} // the int8 key itself
			}
			byKey[k] = ls
			order = append(order, ls)
		}
		if granted && mode != "ExclusiveLock" {
			ls.Sharers = append(ls.Sharers, s)
		} else if granted && ls.Holder == nil {
			s.HeldSince = start
			ls.Holder = &s
			// An elector's statements name its key (lockconn.NameMarker):
			// the holder's last one names the election, fencing or not.
			if name, ok := lockconn.ParseNameMarker(query); ok && ls.Name == "" && leader.KeyFromLockTag(leader.KeyFromName(name).LockTag()) == k {
				ls.Name = name
			}
		} else if !granted {
			s.WaitingSince = wait
			ls.Waiters = append(ls.Waiters, s)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for k, ls := range byKey {
		busy := map[uint32]bool{}
		if ls.Holder != nil {
			busy[ls.Holder.PID] = true
		}
		for _, w := range ls.Waiters {
			busy[w.PID] = true
		}
		ls.Watching = []sessionStatus{}
		standing := map[uint32]bool{}
		for _, s := range rosters[lockconn.NewTarget(k, "", "", "").Roster()] {
			standing[s.PID] = true
			if !busy[s.PID] {
				s.StandingSince = s.started
				ls.Watching = append(ls.Watching, s)
			}
		}
		for i, w := range ls.Waiters {
			if standing[w.PID] {
				ls.Waiters[i].StandingSince = w.started
			}
		}
		ls.Why = rankWhy(ls)
	}
	readLastHandovers(ctx, conn, tbl.history, byKey)
	// Names, terms and election times from the fencing table, when it
	// exists and is readable.
	if q := tbl.terms; q != "" && len(order) > 0 {
		trows, err := conn.Query(ctx, `SELECT classid, objid, objsubid, key_name, term, holder, elected_at FROM `+q)
		if err == nil {
			for trows.Next() {
				var classid, objid uint32
				var objsubid int16
				var name, holder string
				var term int64
				var at time.Time
				if trows.Scan(&classid, &objid, &objsubid, &name, &term, &holder, &at) != nil {
					continue
				}
				ls := byKey[leader.KeyFromLockTag(classid, objid, objsubid)]
				if ls == nil {
					continue
				}
				if ls.Name == "" {
					if i := strings.LastIndex(name, "("); i > 0 {
						ls.Name = name[:i]
					}
				}
				if ls.Holder != nil && ls.Holder.Identity == holder {
					ls.Term = term
					ls.Holder.HeldSince, ls.Holder.HeldSinceExact = &at, true
				}
			}
			trows.Close()
		}
	}
	readValues(ctx, conn, tbl.values, byKey)
	sort.SliceStable(order, func(i, j int) bool {
		a, b := order[i].order, order[j].order
		for n := range a {
			if a[n] != b[n] {
				return a[n] < b[n]
			}
		}
		return false
	})
	return order, nil
}

// sessionList names sessions as identity(pid), comma-separated.
func sessionList(ss []sessionStatus) string {
	var names []string
	for _, s := range ss {
		names = append(names, fmt.Sprintf("%s(%d)", s.label(), s.PID))
	}
	return strings.Join(names, ", ")
}

func renderStatus(w io.Writer, locks []*lockStatus) {
	if len(locks) == 0 {
		fmt.Fprintln(w, "no advisory locks held or awaited in this database")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	history := false
	for _, l := range locks {
		history = history || l.LastHandover != nil
	}
	if history {
		fmt.Fprintln(tw, "KEY\tNAME\tHOLDER\tPID\tUSER\tHELD FOR\tTERM\tLAST HANDOVER\tWAITING")
	} else {
		fmt.Fprintln(tw, "KEY\tNAME\tHOLDER\tPID\tUSER\tHELD FOR\tTERM\tWAITING")
	}
	now := time.Now()
	for _, l := range locks {
		holder, pid, user, held, term := "-", "-", "-", "-", "-"
		if h := l.Holder; h != nil {
			holder, pid, user = h.label(), fmt.Sprint(h.PID), show(h.User)
			if h.HeldSince != nil {
				held = now.Sub(*h.HeldSince).Round(time.Second).String()
				if !h.HeldSinceExact {
					held = "<" + held // the session's age: an upper bound
				}
			}
		}
		if l.Holder == nil && len(l.Sharers) > 0 {
			holder = "(held shared by " + sessionList(l.Sharers) + ")"
		}
		if l.Term > 0 {
			term = fmt.Sprint(l.Term)
		}
		var waiting []string
		for _, s := range l.Waiters {
			w := fmt.Sprintf("%s(%d)", s.label(), s.PID)
			switch {
			case s.StandingSince != nil:
				w += " " + now.Sub(*s.StandingSince).Round(time.Second).String()
			case s.WaitingSince != nil:
				w += " " + now.Sub(*s.WaitingSince).Round(time.Millisecond).String()
			case s.started != nil:
				w += " <" + now.Sub(*s.started).Round(time.Second).String() // before 14: the session's age bounds it
			}
			waiting = append(waiting, w)
		}
		if n := len(l.Watching); n > 0 {
			waiting = append(waiting, fmt.Sprintf("+%d watching", n))
		}
		if history {
			last := "-"
			if h := l.LastHandover; h != nil {
				last = now.Sub(h.At).Round(time.Second).String() + " ago"
				if h.From != "" {
					last += ", from " + show(h.From)
					if h.Reason != "" {
						last += " (" + show(h.Reason) + ")"
					}
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", l.Key, show(l.Name), holder, pid, user, held, term, last, orDash(strings.Join(waiting, ", ")))
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", l.Key, show(l.Name), holder, pid, user, held, term, orDash(strings.Join(waiting, ", ")))
	}
	tw.Flush()
	for _, l := range locks {
		if l.Why == "" {
			continue
		}
		what := l.Key
		if l.Name != "" {
			what = show(l.Name)
		}
		fmt.Fprintf(w, "why %s leads %s: %s\n", l.Holder.label(), what, l.Why)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// show renders a value read from the database for a terminal: any role
// sets its own application_name, and names in pgleader's tables are
// whatever was written there, so a value with anything but printable
// characters (a terminal's escape codes, a newline that forges a line, a
// tab that shifts the columns) is printed quoted, with Go escapes. An
// empty one is "-".
func show(s string) string {
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return orDash(s)
}

// readLastHandovers fills in each key's newest term from the default
// history table, when it exists and is readable: two rows per key, by its
// primary key.
func readLastHandovers(ctx context.Context, conn *pgx.Conn, q string, byKey map[leader.Key]*lockStatus) {
	if len(byKey) == 0 || q == "" {
		return
	}
	var cs, objs []uint32
	var ss []int16
	for k := range byKey {
		c, o, s := k.LockTag()
		cs, objs, ss = append(cs, c), append(objs, o), append(ss, s)
	}
	rows, err := conn.Query(ctx, `SELECT k.c, k.o, k.s, h.elected_at, h.holder, coalesce(h.reason, ''), h.rn
FROM unnest($1::oid[], $2::oid[], $3::int2[]) k(c, o, s)
CROSS JOIN LATERAL (SELECT elected_at, holder, reason, row_number() OVER (ORDER BY term DESC) rn FROM `+q+`
  WHERE classid = k.c AND objid = k.o AND objsubid = k.s ORDER BY term DESC LIMIT 2) h`, cs, objs, ss)
	if err != nil {
		return
	}
	defer rows.Close()
	for rows.Next() {
		var c, o uint32
		var s int16
		var at time.Time
		var holder, reason string
		var rn int64
		if rows.Scan(&c, &o, &s, &at, &holder, &reason, &rn) != nil {
			return
		}
		ls := byKey[leader.KeyFromLockTag(c, o, s)]
		if ls == nil {
			continue
		}
		if ls.LastHandover == nil {
			ls.LastHandover = &handover{}
		}
		if rn == 1 {
			ls.LastHandover.At, ls.LastHandover.To = at, holder
		} else {
			ls.LastHandover.From, ls.LastHandover.Reason = holder, reason
		}
	}
}

// readValues adds to each held key the value its holder proclaimed, from
// the values table quoted (when it exists and is trusted): only a row
// written by the holder's own session (pid, session start, identity) is
// the holder's. A group member's row (keyed by its member lock, see
// lockconn.MemberValueTag) gives its value to every key the member leads.
func readValues(ctx context.Context, conn *pgx.Conn, quoted string, byKey map[leader.Key]*lockStatus) {
	if quoted == "" || len(byKey) == 0 {
		return
	}
	rows, err := conn.Query(ctx, `SELECT classid, objid, objsubid, holder, backend_pid, backend_start, value FROM `+quoted)
	if err != nil {
		return
	}
	type session struct {
		identity string
		pid      uint32
		start    int64
	}
	own := map[leader.Key][]byte{}
	members := map[session][]byte{}
	stamps := map[leader.Key]session{}
	for rows.Next() {
		var classid, objid uint32
		var objsubid int16
		var holder string
		var pid int32
		var start time.Time
		var value []byte
		if rows.Scan(&classid, &objid, &objsubid, &holder, &pid, &start, &value) != nil {
			rows.Close()
			return
		}
		s := session{holder, uint32(pid), start.UnixMicro()}
		if int32(classid) == lockconn.Space && objsubid == 2 {
			members[s] = value
			continue
		}
		k := leader.KeyFromLockTag(classid, objid, objsubid)
		own[k], stamps[k] = value, s
	}
	rows.Close()
	for k, ls := range byKey {
		h := ls.Holder
		if h == nil || h.started == nil {
			continue
		}
		s := session{h.app, h.PID, h.started.UnixMicro()}
		value, ok := own[k]
		if !ok || stamps[k] != s {
			value, ok = members[s]
		}
		switch {
		case !ok:
		case utf8.Valid(value):
			v := string(value)
			h.Value = &v
		default:
			h.ValueBase64 = value
		}
	}
}
