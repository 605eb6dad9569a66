// Command http-active-passive runs two replicas of an HTTP service behind
// leader-only readiness: only the leader answers /readyz with 200, so a
// Kubernetes Service sends traffic to it alone. The leader then resigns and
// readiness moves to the other replica.
//
//	go run ./examples/http-active-passive
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/health"
	"github.com/pgleader/pgleader/internal/exampledb"
	"github.com/pgleader/pgleader/leader"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "http-active-passive:", err)
		os.Exit(1)
	}
}

type replica struct {
	id  string
	e   *elector.Elector
	url string
}

func run() error {
	dsn, release, err := exampledb.DSN()
	if err != nil {
		return err
	}
	defer release()
	sigCtx, stopSignals := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM) // a pod gets SIGTERM
	defer stopSignals()
	ctx, cancel := context.WithCancel(sigCtx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	elected := make(chan string, 4)
	var replicas []*replica
	for _, id := range []string{"blue", "green"} {
		e, err := elector.New(elector.Config{
			Connect: elector.DSN(dsn), Key: leader.KeyFromName("examples/http-active-passive"), Identity: id,
			Callbacks: elector.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) { elected <- l.Identity; <-ctx.Done() }},
		})
		if err != nil {
			return err
		}
		checker := health.NewChecker(e, health.Options{LeaderOnly: true})
		mux := http.NewServeMux()
		mux.Handle("/readyz", checker.ReadyzHandler())
		mux.Handle("/livez", checker.LivezHandler())
		mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello from %s\n", id) })
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: mux}
		wg.Add(2)
		go func() { defer wg.Done(); srv.Serve(ln) }()
		go func() { defer wg.Done(); e.Run(ctx); srv.Close() }()
		replicas = append(replicas, &replica{id: id, e: e, url: "http://" + ln.Addr().String()})
	}
	show := func() {
		for _, r := range replicas {
			resp, err := http.Get(r.url + "/readyz")
			if err != nil {
				fmt.Printf("  %-5s /readyz: %v\n", r.id, err)
				continue
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			fmt.Printf("  %-5s /readyz: %d %s\n", r.id, resp.StatusCode, strings.TrimSpace(string(body)))
		}
	}
	first := <-elected
	time.Sleep(200 * time.Millisecond) // let the follower see the leader
	fmt.Printf("%s leads:\n", first)
	show()
	for _, r := range replicas {
		if r.id == first {
			r.e.Resign(ctx)
		}
	}
	fmt.Printf("%s resigned; %s leads:\n", first, <-elected)
	show()
	return nil
}
