package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pgleader/pgleader/internal/testpg"
)

var shared testpg.Shared

func TestMain(m *testing.M) { os.Exit(testpg.Main(m, nil, &shared)) }

// The example as a user runs it, against a real server: an even spread,
// a replica that stops and comes back, and the fenced ticks checked.
func TestExample(t *testing.T) {
	srv := shared.Get(t)
	t.Setenv("DATABASE_URL", srv.DSN())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())
	for _, want := range []string{"three replicas share 12 tenants:", "replica-2 stopped gracefully", "replica-2 is back", "stale ticks accepted: 0", ": OK"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("no %q in:\n%s", want, out.String())
		}
	}
}
