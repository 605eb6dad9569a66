package elector_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/leader"
)

// Observe follows the leader without campaigning: nobody, then the first
// leader (announced), then its successor after a resign, then nobody again
// once every elector stopped (found by its periodic lookup). Elected is
// closed at the first election.
func TestObserveAndElected(t *testing.T) {
	defer elector.SetObservePoll(elector.SetObservePoll(200 * time.Millisecond))
	srv := sharedServer(t)
	key := testKey(t)
	seen := make(chan string, 64)
	ctx, cancel := context.WithCancel(context.Background())
	obsDone := make(chan error, 1)
	go func() { obsDone <- elector.Observe(ctx, elector.DSN(srv.DSN()), key, func(id string) { seen <- id }) }()
	defer func() {
		cancel()
		if err := <-obsDone; !errors.Is(err, context.Canceled) {
			t.Errorf("Observe returned %v, want context.Canceled", err)
		}
	}()
	expect := func(want string) {
		t.Helper()
		for {
			select {
			case id := <-seen:
				if id == want {
					return
				}
			case <-time.After(waitLong):
				t.Fatalf("Observe never reported %q", want)
			}
		}
	}
	expect("")
	r := newRecorder(t)
	a := start(t, r, opts{dsn: srv.DSN(), key: key, id: "obs-a"})
	select {
	case <-a.e.Elected():
	case <-time.After(waitLong):
		t.Fatal("Elected never closed")
	}
	expect("obs-a")
	b := start(t, r, opts{dsn: srv.DSN(), key: key, id: "obs-b"})
	waitWaiter(t, srv, key, "obs-b")
	select {
	case <-b.e.Elected():
		t.Fatal("Elected closed for a follower")
	default:
	}
	if err := a.e.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	expect("obs-b")
	a.stop()
	b.stop()
	expect("")
	if err := elector.Observe(ctx, nil, key, func(string) {}); !errors.Is(err, elector.ErrInvalidConfig) {
		t.Fatalf("Observe without a Connector: %v", err)
	}
}

// A leader that stops gracefully with no successor announces the vacancy,
// and Observe reports it at once: not at its periodic lookup, which this
// test puts an hour away.
func TestObserveSeesVacancy(t *testing.T) {
	defer elector.SetObservePoll(elector.SetObservePoll(time.Hour))
	srv := sharedServer(t)
	key := testKey(t)
	seen := make(chan string, 64)
	stopObserve := observe(t, srv, key, seen)
	defer stopObserve()
	if id := recv(t, seen, "the first report"); id != "" {
		t.Fatalf("first report %q, want nobody", id)
	}
	r := newRecorder(t)
	a := start(t, r, opts{dsn: srv.DSN(), key: key, id: "vac-a"})
	if id := recv(t, seen, "the leader"); id != "vac-a" {
		t.Fatalf("reported %q, want vac-a", id)
	}
	a.stop()
	stopped := time.Now()
	if id := recv(t, seen, "the vacancy"); id != "" {
		t.Fatalf("reported %q after the leader stopped, want nobody", id)
	}
	t.Logf("the vacancy was reported %s after the leader's Run returned", time.Since(stopped).Round(time.Millisecond))
}

// Observe reports each change once: lookups that find the same holder
// (here every 10 ms) report nothing, and a new leader is reported once.
func TestObserveReportsEachChangeOnce(t *testing.T) {
	defer elector.SetObservePoll(elector.SetObservePoll(10 * time.Millisecond))
	srv := sharedServer(t)
	key := testKey(t)
	r := newRecorder(t)
	a := start(t, r, opts{dsn: srv.DSN(), key: key, id: "once-a"})
	r.next("elected", "once-a")
	seen := make(chan string, 1024)
	stopObserve := observe(t, srv, key, seen)
	defer stopObserve()
	if id := recv(t, seen, "the leader"); id != "once-a" {
		t.Fatalf("reported %q, want once-a", id)
	}
	select { // some 30 lookups find the same holder
	case id := <-seen:
		t.Fatalf("reported %q again with no change", id)
	case <-time.After(300 * time.Millisecond):
	}
	start(t, r, opts{dsn: srv.DSN(), key: key, id: "once-b"})
	a.stop()
	id := recv(t, seen, "the next leader")
	if id == "" { // a vacancy first
		id = recv(t, seen, "the next leader")
	}
	if id != "once-b" {
		t.Fatalf("reported %q, want once-b", id)
	}
	select {
	case id := <-seen:
		t.Fatalf("reported %q again with no change", id)
	case <-time.After(300 * time.Millisecond):
	}
}

// observe runs Observe on key, reporting into seen, until the returned
// stop, which waits for it to return: a test that changes Observe's poll
// restores it (a deferred call that runs after stop) only once no Observe
// of its own reads it.
func observe(t *testing.T, srv *testpg.Server, key leader.Key, seen chan<- string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	report := func(id string) {
		select {
		case seen <- id:
		case <-ctx.Done():
		}
	}
	go func() { done <- elector.Observe(ctx, elector.DSN(srv.DSN()), key, report) }()
	return func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Observe returned %v, want context.Canceled", err)
		}
	}
}
