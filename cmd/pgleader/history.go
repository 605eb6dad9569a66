package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/internal/wire/terms"
	"github.com/pgleader/pgleader/leader"
)

// termRow is one term of the history table.
type termRow struct {
	Key       string     `json:"key"`
	Name      string     `json:"name"`
	Term      int64      `json:"term"`
	Holder    string     `json:"holder"`
	PID       int32      `json:"backend_pid"`
	ElectedAt time.Time  `json:"elected_at"`
	DemotedAt *time.Time `json:"demoted_at"`
	Reason    string     `json:"reason,omitempty"`
	Detail    string     `json:"detail,omitempty"`
}

// cmdHistory prints the terms of one election (or all) from the history
// table that electors with fencing keep.
func cmdHistory(args []string, stdout, stderr io.Writer) error {
	fs, dsn := newFlags("history", "history [--dsn DSN] [--since D] [--json] [--table T] [NAME]",
		`  pgleader history billing-cron             # its terms over the last 24 hours
  pgleader history --since 168h              # every election's terms over a week
  pgleader history billing-cron --json | jq .
Electors keep the history with fencing on (elector.Fencing; pgleader elect
--fencing). A term whose end is blank still runs, or ended without a
word (a crash); the next term marks it "superseded".
`, stderr)
	since := fs.Duration("since", 24*time.Hour, "show terms elected within this long")
	asJSON := fs.Bool("json", false, "print JSON")
	table := fs.String("table", leader.DefaultHistoryTable, "history table")
	var name string
	var err error
	if name, err = parseName(fs, args, true); err != nil {
		return err
	}
	if err := needDSN(dsn.get()); err != nil {
		return err
	}
	if _, err := terms.Quote(*table); err != nil {
		return usageError{msg: err.Error()}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, schemas, err := dial(ctx, dsn.get())
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	q, err := readable(ctx, conn, schemas, *table)
	if err != nil {
		return err
	}
	if q == "" && name != "" {
		return whyNoHistory(ctx, conn, schemas, name, *since, stdout)
	}
	if q == "" {
		return fmt.Errorf("%w: no readable history table %s; electors keep one only with fencing (elector.Fencing, pgleader elect --fencing)", errNoHistory, *table)
	}
	rows, err := readHistory(ctx, conn, q, name, *since)
	if err != nil {
		return terms.Classify(err, *table)
	}
	if len(rows) == 0 && name != "" {
		// Nothing in the window: say whether this election keeps history
		// at all, from its fencing terms.
		if err := whyNoHistory(ctx, conn, schemas, name, *since, stdout); err != nil {
			return err
		}
		return nil
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	if len(rows) == 0 {
		fmt.Fprintf(stdout, "no terms elected in the last %s\n", *since)
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tTERM\tHOLDER\tPID\tELECTED\tDEMOTED\tHELD\tREASON")
	for _, r := range rows {
		demoted, held := "-", time.Since(r.ElectedAt).Round(time.Millisecond).String()+" (leads)"
		if r.DemotedAt != nil {
			demoted = r.DemotedAt.Local().Format("2006-01-02 15:04:05.000")
			held = r.DemotedAt.Sub(r.ElectedAt).Round(time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t%s\t%s\t%s\n", show(r.Name), r.Term, show(r.Holder), r.PID,
			r.ElectedAt.Local().Format("2006-01-02 15:04:05.000"), demoted, held, show(r.Reason))
	}
	return tw.Flush()
}

// errNoHistory: the election keeps no history.
var errNoHistory = errors.New("no history kept")

// whyNoHistory explains an empty history of name: an election without
// fencing terms keeps none (an error: exit 1); one whose current term began
// within the window keeps none either (Fencing.NoHistory); one whose
// current term is older simply had no election in the window.
func whyNoHistory(ctx context.Context, conn *pgx.Conn, schemas []string, name string, since time.Duration, stdout io.Writer) error {
	q := optional(ctx, conn, schemas, leader.DefaultTermsTable)
	var term int64
	var at time.Time
	err := errors.New("no terms table")
	if q != "" {
		c, o, s := leader.KeyFromName(name).LockTag()
		err = conn.QueryRow(ctx, `SELECT term, elected_at FROM `+q+` WHERE classid = $1 AND objid = $2 AND objsubid = $3`, c, o, s).Scan(&term, &at)
	}
	switch {
	case err != nil:
		return fmt.Errorf("%w: %s has no fencing term, so its electors run without fencing, and history is kept only with fencing (elector.Fencing, pgleader elect --fencing)", errNoHistory, name)
	case time.Since(at) < since:
		return fmt.Errorf("%w: %s's current term %d began %s ago, but the history has no row of it: its electors keep no history (Fencing.NoHistory)", errNoHistory, name, term, time.Since(at).Round(time.Second))
	}
	fmt.Fprintf(stdout, "no terms of %s elected in the last %s; its current term %d began at %s\n", name, since, term, at.Local().Format("2006-01-02 15:04:05"))
	return nil
}

// readHistory reads the terms elected within since, of name's key or of
// every key, oldest first.
func readHistory(ctx context.Context, conn *pgx.Conn, quoted, name string, since time.Duration) ([]termRow, error) {
	where, args := "elected_at >= now() - make_interval(secs => $1)", []any{since.Seconds()}
	if name != "" {
		c, o, s := leader.KeyFromName(name).LockTag()
		where += " AND classid = $2 AND objid = $3 AND objsubid = $4"
		args = append(args, c, o, s)
	}
	rs, err := conn.Query(ctx, `SELECT classid, objid, objsubid, key_name, term, holder, backend_pid, elected_at, demoted_at,
  coalesce(reason, ''), coalesce(detail, '') FROM `+quoted+` WHERE `+where+` ORDER BY elected_at, term`, args...)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	var out []termRow
	for rs.Next() {
		var r termRow
		var c, o uint32
		var s int16
		if err := rs.Scan(&c, &o, &s, &r.Name, &r.Term, &r.Holder, &r.PID, &r.ElectedAt, &r.DemotedAt, &r.Reason, &r.Detail); err != nil {
			return nil, err
		}
		r.Key = leader.KeyFromLockTag(c, o, s).String()
		out = append(out, r)
	}
	return out, rs.Err()
}
