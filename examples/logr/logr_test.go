package main

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/leader"
	"github.com/pgleader/pgleader/pgleadertest"
	"github.com/pgleader/pgleader/slogcore"
)

var shared pgleadertest.Shared

func TestMain(m *testing.M) { os.Exit(pgleadertest.Main(m, &shared)) }

// An elector logging through a logr.Logger: its lines arrive with their
// fields (key, identity) and levels (Info at V(0), Warn and Error as logr
// errors or V(0) lines).
func TestElectorLogsThroughLogr(t *testing.T) {
	var mu sync.Mutex
	var lines []string
	log := funcr.New(func(prefix, args string) {
		mu.Lock()
		lines = append(lines, prefix+" "+args)
		mu.Unlock()
	}, funcr.Options{Verbosity: 1})

	srv := shared.Get(t)
	elected := make(chan struct{})
	e, err := elector.New(elector.Config{
		Connect:  leader.DSN(srv.DSN()),
		Key:      leader.KeyFromName(t.Name()),
		Identity: "logr-user",
		Logger:   slogcore.New(logr.ToSlogHandler(log)),
		Callbacks: elector.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) {
			close(elected)
			<-ctx.Done()
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	select {
	case <-elected:
	case <-time.After(30 * time.Second):
		t.Fatal("not elected")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, l := range lines {
		if strings.Contains(l, `"msg"="elected"`) && strings.Contains(l, `"identity"="logr-user"`) && strings.Contains(l, `"key"=`) {
			return
		}
	}
	t.Fatalf("no \"elected\" line with its fields among %d logr lines:\n%s", len(lines), strings.Join(lines, "\n"))
}
