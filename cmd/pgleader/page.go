package main

import (
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/leader"
)

// The live page: one read-only HTML page for the whole database, served by
// pgleader status --serve. Everything on it comes from the database and is
// untrusted (any role sets its own application_name; key names come from a
// table), so html/template escapes every value, the page runs no script at
// all, and the Content-Security-Policy forbids any anyway. It refreshes
// itself with a meta refresh. Only GET and HEAD are served.

// pageData is what the page shows.
type pageData struct {
	Now       time.Time
	Database  string
	Locks     []*lockStatus // the elections outside groups
	Groups    []*groupView
	Handovers []termRow
	History   bool // the history table exists and is readable
	Refresh   int  // seconds
	Error     string
}

// listWatchers is how many of a key's watchers the page names.
const listWatchers = 8

var pageFuncs = template.FuncMap{
	"listWatchers": func() int { return listWatchers },
	"age": func(now time.Time, t *time.Time) string {
		if t == nil {
			return ""
		}
		return shortDuration(now.Sub(*t))
	},
	"ago":   func(now, t time.Time) string { return shortDuration(now.Sub(t)) + " ago" },
	"clock": func(t time.Time) string { return t.Local().Format("15:04:05.000") },
	"held": func(r termRow) string {
		if r.DemotedAt == nil {
			return "leads"
		}
		return shortDuration(r.DemotedAt.Sub(r.ElectedAt))
	},
}

// shortDuration rounds d for a person: ms below a second, s below a
// minute, then the coarser units.
func shortDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}

var pageTemplate = template.Must(template.New("page").Funcs(pageFuncs).Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="refresh" content="{{.Refresh}}">
<title>pgleader: who leads what</title>
<link rel="stylesheet" href="style.css">
</head>
<body>
<header>
<h1>pgleader</h1>
<p class="meta">database <b>{{.Database}}</b> · {{clock .Now}} · refreshes every {{.Refresh}} s</p>
</header>
{{if .Error}}<p class="error">{{.Error}}</p>{{end}}
{{if .Groups}}<section>
<h2>Groups</h2>
<div class="scroll"><table id="groups">
<thead><tr><th>Group</th><th>Keys</th><th>Leaderless</th><th>Members (keys led)</th></tr></thead>
<tbody>
{{range .Groups}}<tr class="{{if .Leaderless}}leaderless{{else}}led{{end}}">
<td><span class="name">{{.Name}}</span></td><td>{{.Keys}}</td><td>{{if .Leaderless}}<span class="none">{{.Leaderless}}</span>{{else}}0{{end}}</td>
<td>{{range .Members}}<div><span class="leader">{{if .Identity}}{{.Identity}}{{else}}pid {{.PID}}{{end}}</span>{{template "rank" .Rank}} {{.Owned}} <span class="sub">pid {{.PID}} · {{.User}}</span></div>{{end}}</td>
</tr>
{{end}}
</tbody></table></div>
</section>
{{end}}
<section>
<h2>Elections</h2>
{{if not .Locks}}<p>No advisory lock is held or awaited in this database.</p>{{else}}
<div class="scroll"><table id="elections">
<thead><tr><th>Election</th><th>Leader</th><th>Since</th><th>Term</th><th>Waiting</th><th>Watching</th><th>Last handover</th></tr></thead>
<tbody>
{{range .Locks}}{{$now := $.Now}}
<tr class="{{if .Holder}}led{{else}}leaderless{{end}}">
<td><span class="name">{{if .Name}}{{.Name}}{{else}}(unnamed){{end}}</span><br><span class="key">{{.Key}}</span></td>
<td>{{with .Holder}}<span class="leader">{{if .Identity}}{{.Identity}}{{else}}(no application_name){{end}}</span>{{template "rank" .Rank}}<br><span class="sub">pid {{.PID}} · {{.User}}</span>{{with .Value}}<br><span class="sub">value {{.}}</span>{{end}}{{else}}<span class="none">NO LEADER</span>{{end}}{{with .Why}}<br><span class="sub">why: {{.}}</span>{{end}}</td>
<td>{{with .Holder}}{{if .HeldSince}}{{if not .HeldSinceExact}}&lt;{{end}}{{age $now .HeldSince}}{{end}}{{end}}</td>
<td>{{if .Term}}{{.Term}}{{end}}</td>
<td>{{range .Waiters}}<div>{{if .Identity}}{{.Identity}}{{else}}pid {{.PID}}{{end}}{{template "rank" .Rank}} <span class="sub">{{if .StandingSince}}{{age $now .StandingSince}}{{else if .WaitingSince}}{{age $now .WaitingSince}}{{end}}</span></div>{{end}}</td>
<td>{{range $i, $w := .Watching}}{{if lt $i listWatchers}}<div>{{if .Identity}}{{.Identity}}{{else}}pid {{.PID}}{{end}}{{template "rank" .Rank}}</div>{{end}}{{end}}{{if gt (len .Watching) listWatchers}}<div class="sub">{{len .Watching}} in all</div>{{end}}</td>
<td>{{with .LastHandover}}{{ago $now .At}}{{if .From}}<br><span class="sub">from {{.From}}{{if .Reason}} ({{.Reason}}){{end}}</span>{{end}}{{end}}</td>
</tr>
{{end}}
</tbody></table></div>
{{end}}
</section>
<section>
<h2>Recent handovers</h2>
{{if not .History}}<p>No history table here: electors keep one with fencing on (elector.Fencing, pgleader elect --fencing).</p>
{{else if not .Handovers}}<p>No election in the last 24 hours.</p>
{{else}}
<div class="scroll"><table id="handovers">
<thead><tr><th>Elected</th><th>Election</th><th>Term</th><th>Leader</th><th>Held</th><th>Ended because</th></tr></thead>
<tbody>
{{range .Handovers}}<tr><td>{{clock .ElectedAt}}</td><td>{{.Name}}</td><td>{{.Term}}</td><td>{{.Holder}} <span class="sub">pid {{.PID}}</span></td><td>{{held .}}</td><td>{{.Reason}}</td></tr>
{{end}}
</tbody></table></div>
{{end}}
</section>
<footer><p>Read-only. This page shows only what any role that can connect to this database can read itself: pg_locks, pg_stat_activity and pgleader's terms and history tables. Names and identities are shown as the sessions set them.</p></footer>
</body>
</html>
{{define "rank"}}{{with .}} <span class="sub">{{.Strategy}} priority {{.Priority}}{{with .Version}} version {{.}}{{end}}</span>{{end}}{{end}}`))

const pageCSS = `body{font:15px/1.4 system-ui,sans-serif;margin:0 auto;max-width:72rem;padding:0 1rem;color:#1b1f23;background:#fff}
h1{font-size:1.4rem;margin:.8rem 0 0}h2{font-size:1.1rem;margin:1.2rem 0 .4rem}
.meta,.sub,.key{color:#57606a;font-size:.85em}.key{font-family:ui-monospace,monospace}
.scroll{overflow-x:auto}table{border-collapse:collapse;width:100%}
th,td{text-align:left;vertical-align:top;padding:.35rem .5rem;border-bottom:1px solid #d0d7de}
th{font-size:.85em;color:#57606a;font-weight:600}
tr.leaderless td{background:#fff1f0}.none{color:#cf222e;font-weight:700}.leader{font-weight:600}
.error{color:#cf222e}footer{margin:2rem 0 1rem;color:#57606a;font-size:.85em}
@media (prefers-color-scheme:dark){body{background:#0d1117;color:#e6edf3}th,td{border-color:#30363d}tr.leaderless td{background:#3b1d1d}}
`

// pageServer serves the live page from a small pool.
type pageServer struct {
	pool    *pgxpool.Pool
	known   map[string]string
	refresh time.Duration

	mu      sync.Mutex
	schemas []string // the role's own, read as each connection was pinned
}

func (p *pageServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.Set("Allow", "GET, HEAD")
		http.Error(w, "read-only", http.StatusMethodNotAllowed)
		return
	}
	switch r.URL.Path {
	case "/style.css":
		h.Set("Content-Type", "text/css; charset=utf-8")
		io.WriteString(w, pageCSS)
		return
	case "/status.json":
		d := p.read(r.Context())
		h.Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"locks": d.Locks, "groups": d.Groups, "handovers": d.Handovers, "error": d.Error})
		return
	case "/":
	default:
		http.NotFound(w, r)
		return
	}
	d := p.read(r.Context())
	h.Set("Content-Type", "text/html; charset=utf-8")
	if err := pageTemplate.Execute(w, d); err != nil {
		fmt.Fprintf(w, "<!-- %s -->", template.HTMLEscapeString(err.Error()))
	}
}

// read gathers the page's data; a database error is shown on the page.
func (p *pageServer) read(ctx context.Context) pageData {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	d := pageData{Now: time.Now(), Refresh: max(1, int(p.refresh.Seconds()))}
	err := p.pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error {
		conn := c.Conn()
		if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&d.Database); err != nil {
			return err
		}
		p.mu.Lock()
		schemas := p.schemas
		p.mu.Unlock()
		tbl := tables{terms: optional(ctx, conn, schemas, leader.DefaultTermsTable),
			history: optional(ctx, conn, schemas, leader.DefaultHistoryTable), values: optional(ctx, conn, schemas, leader.DefaultValuesTable)}
		locks, err := readStatus(ctx, conn, tbl, p.known)
		if err != nil {
			return err
		}
		if d.Groups, err = readGroups(ctx, conn, locks); err != nil {
			return err
		}
		d.Locks = ungrouped(locks)
		if d.History = tbl.history != ""; d.History {
			rows, err := readHistory(ctx, conn, tbl.history, "", 24*time.Hour)
			if err != nil {
				return err
			}
			// The newest 30, newest first.
			for i := len(rows) - 1; i >= 0 && len(d.Handovers) < 30; i-- {
				d.Handovers = append(d.Handovers, rows[i])
			}
		}
		return nil
	})
	if err != nil {
		d.Error = "could not read the database: " + err.Error()
	}
	return d
}

// servePage serves the page on addr until ctx ends; ready gets the
// address it listens on.
func servePage(ctx context.Context, dsn, addr string, known map[string]string, refresh time.Duration, ready func(string)) error {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	cfg.MaxConns = 2
	cfg.ConnConfig.RuntimeParams["application_name"] = "pgleader status --serve"
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	ps := &pageServer{known: known, refresh: refresh}
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		// Pinned as dial pins (see dial).
		schemas, err := lockconn.Pin(ctx, conn)
		ps.mu.Lock()
		ps.schemas = schemas
		ps.mu.Unlock()
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	ps.pool = pool
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: ps, ReadHeaderTimeout: 10 * time.Second}
	ready(ln.Addr().String())
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); err != nil && !strings.Contains(err.Error(), "Server closed") {
		return err
	}
	return nil
}
