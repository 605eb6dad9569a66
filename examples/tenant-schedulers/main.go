// Command tenant-schedulers runs one scheduler per tenant across three
// replicas with an elector.Group: each replica leads its share of the
// tenants on one connection; when a replica stops, its tenants move to the
// others, and when it comes back it takes its share again.
//
//	go run ./examples/tenant-schedulers
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/internal/exampledb"
	"github.com/pgleader/pgleader/leader"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "tenant-schedulers:", err)
		os.Exit(1)
	}
}

var tenants = []string{"acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "tyrell", "cyberdyne", "wonka", "soylent", "oscorp"}

type replica struct {
	g      *elector.Group
	cancel context.CancelFunc
	done   chan struct{}
}

func run(ctx context.Context) error {
	dsn, release, err := exampledb.DSN()
	if err != nil {
		return err
	}
	defer release()
	var keys []leader.Key
	for _, t := range tenants {
		keys = append(keys, leader.KeyFromName("tenant-scheduler/"+t))
	}
	start := func(id string) (*replica, error) {
		g, err := elector.NewGroup(elector.GroupConfig{
			Connect:  elector.DSN(dsn),
			Group:    "tenant-schedulers",
			Keys:     keys,
			Identity: id,
			Callbacks: elector.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) {
				// The tenant's scheduler runs here until the key is handed
				// over (ctx ends); one tick a second, quietly.
				t := time.NewTicker(time.Second)
				defer t.Stop()
				for {
					select {
					case <-ctx.Done():
						return
					case <-t.C:
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
				fmt.Println(what)
				fmt.Println(strings.Join(lines, "\n"))
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
	return show("replica-2 is back and took its share again", began, "replica-1", "replica-2", "replica-3")
}
