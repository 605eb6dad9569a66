package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pgleader/pgleader/internal/testpg"
)

var shared testpg.Shared

func TestMain(m *testing.M) { os.Exit(testpg.Main(m, nil, &shared)) }

// Both replicas are ready, and both answer every request from the leader,
// before and after the leader resigns.
func TestExample(t *testing.T) {
	t.Setenv("DATABASE_URL", shared.Get(t).DSN())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())
	header := regexp.MustCompile(`(\S+) leads; a request to each replica:`)
	handled := regexp.MustCompile(`/work\s+200 handled by (\S+)`)
	var leaders []string
	sections := header.FindAllStringSubmatchIndex(out.String(), -1)
	if len(sections) != 2 {
		t.Fatalf("want two leaders, before and after the resign:\n%s", out.String())
	}
	for i, sec := range sections {
		leader := out.String()[sec[2]:sec[3]]
		end := len(out.String())
		if i+1 < len(sections) {
			end = sections[i+1][0]
		}
		body := out.String()[sec[1]:end]
		if strings.Count(body, "/readyz 200 ok") != 2 {
			t.Fatalf("both replicas must be ready while %s leads:\n%s", leader, body)
		}
		by := handled.FindAllStringSubmatch(body, -1)
		if len(by) != 2 || by[0][1] != leader || by[1][1] != leader {
			t.Fatalf("both replicas must answer from the leader %s:\n%s", leader, body)
		}
		leaders = append(leaders, leader)
	}
	if leaders[0] == leaders[1] {
		t.Fatalf("the same leader after the resign: %v", leaders)
	}
}
