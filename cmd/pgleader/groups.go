package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/inspect"
)

// groupView is an group.Group as the database shows it: its members hold
// its roster lock, and each member's session names the group and its key
// count in pg_stat_activity (see inspect.ParseGroupMarker).
type groupView struct {
	Name    string        `json:"name"`
	Keys    int           `json:"keys"`
	Members []groupMember `json:"members"`
	// Leaderless is how many keys no member leads now.
	Leaderless int `json:"leaderless"`
}

type groupMember struct {
	Identity string `json:"identity"`
	// Rank is a ranked member's, from its application_name.
	Rank  *rankStatus `json:"rank,omitempty"`
	PID   uint32      `json:"pid"`
	User  string      `json:"user"`
	Owned int         `json:"owned"`
	Since *time.Time  `json:"since,omitempty"` // the member's session start
}

// readGroups finds the groups whose members' sessions show their marker,
// lists their members and counts the keys each leads; it sets Group on
// those keys' entries in locks.
func readGroups(ctx context.Context, conn *pgx.Conn, locks []*lockStatus) ([]*groupView, error) {
	rows, err := conn.Query(ctx, `SELECT coalesce(query, '') FROM pg_stat_activity
WHERE datid = (SELECT datid FROM pg_stat_activity WHERE pid = pg_backend_pid()) AND query LIKE 'SELECT ''pgleader group v1 %'`)
	if err != nil {
		return nil, err
	}
	queries, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	byName := map[string]*groupView{}
	for _, q := range queries {
		name, keys, ok := inspect.ParseGroupMarker(q)
		if !ok {
			continue
		}
		if g := byName[name]; g == nil || keys > g.Keys {
			byName[name] = &groupView{Name: name, Keys: keys, Members: []groupMember{}}
		}
	}
	if len(byName) == 0 {
		return nil, nil
	}
	var names []string
	var classes, objs []uint32
	for name := range byName {
		c, o := inspect.GroupRoster(name)
		names, classes, objs = append(names, name), append(classes, c), append(objs, o)
	}
	rows, err = conn.Query(ctx, `SELECT r.name, l.pid, coalesce(a.application_name, ''), coalesce(a.usename::text, ''), a.backend_start
FROM unnest($1::text[], $2::oid[], $3::oid[]) AS r(name, c, o)
JOIN pg_locks l ON l.locktype = 'advisory' AND l.classid = r.c AND l.objid = r.o AND l.objsubid = 2 AND l.granted
LEFT JOIN pg_stat_activity a ON a.pid = l.pid
ORDER BY 1, 3, 2`, names, classes, objs)
	if err != nil {
		return nil, err
	}
	member := map[uint32]*groupView{}
	for rows.Next() {
		var name string
		var m groupMember
		var pid int32
		var app string
		if err := rows.Scan(&name, &pid, &app, &m.User, &m.Since); err != nil {
			rows.Close()
			return nil, err
		}
		m.PID = uint32(pid)
		m.Identity, m.Rank = splitApp(app)
		g := byName[name]
		g.Members = append(g.Members, m)
		member[m.PID] = g
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, l := range locks {
		if l.Holder == nil {
			continue
		}
		if g := member[l.Holder.PID]; g != nil {
			l.Group = g.Name
			for i := range g.Members {
				if g.Members[i].PID == l.Holder.PID {
					g.Members[i].Owned++
				}
			}
		}
	}
	var out []*groupView
	for _, g := range byName {
		owned := 0
		for _, m := range g.Members {
			owned += m.Owned
		}
		g.Leaderless = max(0, g.Keys-owned)
		out = append(out, g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// ungrouped returns the locks that belong to no group.
func ungrouped(locks []*lockStatus) []*lockStatus {
	var out []*lockStatus
	for _, l := range locks {
		if l.Group == "" {
			out = append(out, l)
		}
	}
	return out
}

func renderGroups(w io.Writer, groups []*groupView) {
	if len(groups) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tKEYS\tLEADERLESS\tMEMBERS (KEYS LED)")
	for _, g := range groups {
		var ms []string
		for _, m := range g.Members {
			ms = append(ms, fmt.Sprintf("%s(%d) %d", label(m.Identity, m.Rank), m.PID, m.Owned))
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", show(g.Name), g.Keys, g.Leaderless, orDash(strings.Join(ms, ", ")))
	}
	tw.Flush()
	fmt.Fprintln(w)
}
