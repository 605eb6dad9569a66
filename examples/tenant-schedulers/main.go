// Command tenant-schedulers runs one scheduler per tenant across three
// replicas with an group.Group: each replica leads its share of the
// tenants on one connection; when a replica stops, its tenants move to the
// others, and when it comes back it takes its share again.
//
// Each tenant's scheduler ticks every 200ms and records its tick in a
// fenced transaction (leader.Fence with the tenant's own term), as real
// per-tenant work would. At the end the example checks the ticks: no tick
// accepted with a stale term, and no two replicas ticking for one tenant
// at once.
//
//	go run ./examples/tenant-schedulers
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgleader/pgleader/group"
	"github.com/pgleader/pgleader/leader"
	"github.com/pgleader/pgleader/pgleadertest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "tenant-schedulers:", err)
		os.Exit(1)
	}
}

var tenants = []string{"acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "tyrell", "cyberdyne", "wonka", "soylent", "oscorp"}

type replica struct {
	g      *group.Group
	cancel context.CancelFunc
	done   chan struct{}
}

// ticksDDL is the example's record of work: one row per tick, with the
// tenant's term and the replica that ticked.
const ticksDDL = `CREATE TABLE IF NOT EXISTS tenant_ticks (id bigserial PRIMARY KEY, tenant text NOT NULL, term bigint NOT NULL,
  replica text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`

// tick records one tick of tenant l.Key, fenced: it commits only while l's
// term is the tenant's newest.
func tick(ctx context.Context, pool *pgxpool.Pool, l leader.Leadership) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := l.Fence(ctx, tx); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO tenant_ticks (tenant, term, replica) VALUES ($1, $2, $3)`, l.Key.Name(), l.Term, l.Identity)
		return err
	})
}

func run(ctx context.Context, out io.Writer) error {
	dsn, release, err := pgleadertest.Database()
	if err != nil {
		return err
	}
	defer release()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, ticksDDL+"; TRUNCATE tenant_ticks", pgx.QueryExecModeSimpleProtocol); err != nil {
		return err
	}
	var refused sync.Map // tenant -> fenced ticks refused
	var keys []leader.Key
	for _, t := range tenants {
		keys = append(keys, leader.KeyFromName("tenant-scheduler/"+t))
	}
	start := func(id string) (*replica, error) {
		g, err := group.New(group.Config{
			Connect:  leader.DSN(dsn),
			Group:    "tenant-schedulers",
			Keys:     keys,
			Identity: id,
			Fencing:  group.Fencing{Enabled: true}, // a term per tenant
			Callbacks: group.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) {
				// The tenant's scheduler runs here until the key is handed
				// over (ctx ends): a tick every 200ms, each one fenced.
				t := time.NewTicker(200 * time.Millisecond)
				defer t.Stop()
				for {
					select {
					case <-ctx.Done():
						return
					case <-t.C:
					}
					if err := tick(ctx, pool, l); errors.Is(err, leader.ErrFenced) {
						n, _ := refused.LoadOrStore(l.Key.Name(), new(int))
						*n.(*int)++
					}
				}
			}},
		})
		if err != nil {
			return nil, err
		}
		rctx, cancel := context.WithCancel(ctx)
		r := &replica{g: g, cancel: cancel, done: make(chan struct{})}
		go func() { defer close(r.done); g.Run(rctx) }()
		return r, nil
	}
	replicas := map[string]*replica{}
	var mu sync.Mutex
	for _, id := range []string{"replica-1", "replica-2", "replica-3"} {
		r, err := start(id)
		if err != nil {
			return err
		}
		replicas[id] = r
	}
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range replicas {
			r.cancel()
			<-r.done
		}
	}()
	// show prints who leads which tenants once every tenant is led by the
	// replicas listed, in an even spread.
	show := func(what string, began time.Time, ids ...string) error {
		deadline := time.Now().Add(30 * time.Second)
		for {
			total, counts, lines := 0, map[string]int{}, []string{}
			for _, id := range ids {
				var names []string
				for _, k := range replicas[id].g.Owned() {
					names = append(names, strings.TrimPrefix(k.Name(), "tenant-scheduler/"))
				}
				sort.Strings(names)
				counts[id] = len(names)
				total += len(names)
				lines = append(lines, fmt.Sprintf("  %s leads %2d: %s", id, len(names), strings.Join(names, " ")))
			}
			even := total == len(tenants)
			for _, n := range counts {
				even = even && n >= len(tenants)/len(ids) && n <= (len(tenants)+len(ids)-1)/len(ids)
			}
			if even {
				if !began.IsZero() {
					what += fmt.Sprintf(" (even again %s after it began)", time.Since(began).Round(time.Millisecond))
				}
				fmt.Fprintln(out, what)
				fmt.Fprintln(out, strings.Join(lines, "\n"))
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: no even spread within 30s: %v", what, counts)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if err := show("three replicas share 12 tenants:", time.Time{}, "replica-1", "replica-2", "replica-3"); err != nil {
		return err
	}
	began := time.Now()
	mu.Lock()
	replicas["replica-2"].cancel()
	<-replicas["replica-2"].done
	delete(replicas, "replica-2")
	mu.Unlock()
	if err := show("replica-2 stopped gracefully; its tenants moved to the others", began, "replica-1", "replica-3"); err != nil {
		return err
	}
	began = time.Now()
	r, err := start("replica-2")
	if err != nil {
		return err
	}
	mu.Lock()
	replicas["replica-2"] = r
	mu.Unlock()
	if err := show("replica-2 is back and took its share again", began, "replica-1", "replica-2", "replica-3"); err != nil {
		return err
	}
	time.Sleep(time.Second) // a few more ticks on the new spread
	return check(ctx, pool, out)
}

// check reads the ticks back: every tenant ticked; per tenant, no tick
// with a term older than one accepted before it; and no two replicas
// ticking for one tenant within 100ms of each other (a hand-over waits
// for the old scheduler to return before the new one starts).
func check(ctx context.Context, pool *pgxpool.Pool, out io.Writer) error {
	var ticks, tenantsTicked, stale, overlaps int
	err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT tenant),
  (SELECT count(*) FROM (SELECT term < max(term) OVER (PARTITION BY tenant ORDER BY id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS s FROM tenant_ticks) x WHERE s),
  (SELECT count(*) FROM (SELECT replica, lag(replica) OVER w AS prev, at - lag(at) OVER w AS gap FROM tenant_ticks WINDOW w AS (PARTITION BY tenant ORDER BY at)) y
    WHERE prev <> replica AND gap < interval '100 ms')
FROM tenant_ticks`).Scan(&ticks, &tenantsTicked, &stale, &overlaps)
	if err != nil {
		return err
	}
	verdict := "OK"
	if tenantsTicked != len(tenants) || stale > 0 || overlaps > 0 {
		verdict = "FAILED"
	}
	fmt.Fprintf(out, "check: %d fenced ticks from %d tenants; stale ticks accepted: %d; hand-overs with two replicas ticking within 100ms: %d: %s\n",
		ticks, tenantsTicked, stale, overlaps, verdict)
	if verdict != "OK" {
		return errors.New("the tick check failed")
	}
	return nil
}
