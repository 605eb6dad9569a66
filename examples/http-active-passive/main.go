// Command http-active-passive runs two replicas of an HTTP service in which
// only the leader does the work, the way docs/kubernetes.md recommends for
// a Deployment: every replica is ready (readiness does not follow
// leadership, so a rolling update never stalls), and a follower passes each
// request on to the leader. Each replica proclaims its own address as its
// leader value (elector.Config.Value), so a follower knows where the leader
// listens from e.LeaderValue(). The leader then resigns, and the requests
// follow the new one.
//
//	go run ./examples/http-active-passive
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/health"
	"github.com/pgleader/pgleader/leader"
	"github.com/pgleader/pgleader/pgleadertest"
)

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "http-active-passive:", err)
		os.Exit(1)
	}
}

// replica is one instance of the service.
type replica struct {
	e   *elector.Elector
	url string // its own address, which is also its leader value
}

// handler serves the work on the leader and passes it on from a follower.
func (r *replica) handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if r.e.IsLeader() {
			fmt.Fprintf(w, "handled by %s\n", r.e.Identity())
			return
		}
		// The leader's value is its address (behind a pod network, its
		// pod IP and port): nil while nobody leads, and for a moment after
		// an election, until the new leader has written its value.
		to := r.e.LeaderValue().Value
		if to == nil {
			http.Error(w, "no leader right now; try again", http.StatusServiceUnavailable)
			return
		}
		target, err := url.Parse(string(to))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		httputil.NewSingleHostReverseProxy(target).ServeHTTP(w, req)
	})
}

func run(ctx context.Context, out io.Writer) error {
	dsn, release, err := pgleadertest.Database()
	if err != nil {
		return err
	}
	defer release()
	ctx, stopSignals := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM) // a pod gets SIGTERM
	defer stopSignals()
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	var replicas []*replica
	for i := range 2 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		addr := "http://" + ln.Addr().String()
		e, err := elector.New(elector.Config{
			Connect: elector.DSN(dsn), Key: leader.KeyFromName("examples/http-active-passive"),
			Identity:  fmt.Sprintf("web-%d", i), // in a pod: its name
			Value:     []byte(addr),             // where the others send the work
			Callbacks: elector.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) { <-ctx.Done() }},
		})
		if err != nil {
			return err
		}
		r := &replica{e: e, url: addr}
		// Default readiness: ready whenever the process works, leader or
		// not (see docs/kubernetes.md); liveness catches a wedged elector.
		checker := health.NewChecker(e, health.Options{})
		mux := http.NewServeMux()
		mux.Handle("/readyz", checker.ReadyzHandler())
		mux.Handle("/livez", checker.LivezHandler())
		mux.Handle("/", r.handler())
		srv := &http.Server{Handler: mux}
		wg.Add(2)
		go func() { defer wg.Done(); srv.Serve(ln) }()
		go func() { defer wg.Done(); e.Run(ctx); srv.Close() }()
		replicas = append(replicas, r)
	}
	// Wait until one leads and the other knows it.
	first, err := waitLeader(ctx, replicas)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%s leads; a request to each replica:\n", first.e.Identity())
	if err := ask(out, replicas); err != nil {
		return err
	}
	if err := first.e.Resign(ctx); err != nil {
		return err
	}
	next, err := waitLeader(ctx, replicas)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%s resigned; %s leads; a request to each replica:\n", first.e.Identity(), next.e.Identity())
	return ask(out, replicas)
}

// waitLeader waits until a replica leads and every other one knows its
// address.
func waitLeader(ctx context.Context, replicas []*replica) (*replica, error) {
	for {
		for _, r := range replicas {
			if !r.e.IsLeader() {
				continue
			}
			seen := true
			for _, o := range replicas {
				seen = seen && string(o.e.LeaderValue().Value) == r.url
			}
			if seen {
				return r, nil
			}
		}
		for _, r := range replicas {
			select {
			case <-r.e.Done(): // Run gave up: a wrong DSN, a pooler
				return nil, fmt.Errorf("replica %s stopped: %w", r.e.Identity(), r.e.Err())
			default:
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// ask sends one request to each replica, and its readiness, and prints the
// answers.
func ask(out io.Writer, replicas []*replica) error {
	for _, r := range replicas {
		for _, path := range []string{"/readyz", "/work"} {
			resp, err := http.Get(r.url + path)
			if err != nil {
				return err
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			fmt.Fprintf(out, "  %s%-7s %d %s\n", r.e.Identity(), path, resp.StatusCode, strings.TrimSpace(string(body)))
		}
	}
	return nil
}
