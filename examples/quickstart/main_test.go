package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgleader/pgleader/internal/testpg"
)

var shared testpg.Shared

func TestMain(m *testing.M) { os.Exit(testpg.Main(m, nil, &shared)) }

// build compiles the Quick start as a user would.
func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "quickstart")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// A newcomer's first mistake, a wrong password, ends the program at once,
// non-zero, with the server's message; an unset DATABASE_URL too.
func TestQuickstartSaysWhatIsWrong(t *testing.T) {
	srv := shared.Get(t)
	ctx := context.Background()
	srv.Exec(ctx, "CREATE ROLE "+testpg.PasswordRole+" NOLOGIN")
	if err := srv.Exec(ctx, "CREATE ROLE qs_user LOGIN PASSWORD 'right' IN ROLE "+testpg.PasswordRole); err != nil {
		t.Fatal(err)
	}
	bin := build(t)
	for _, tc := range []struct {
		dsn, want string
	}{
		{fmt.Sprintf("postgres://qs_user:wrong@%s/postgres", srv.Addr()), "password authentication failed"},
		{"", "DATABASE_URL"},
	} {
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+tc.dsn, "PGHOST=", "PGSERVICE=", "PGDATABASE=")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		began := time.Now()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(out.String(), tc.want) {
				t.Fatalf("DATABASE_URL=%q: exit %v, want non-zero and %q in:\n%s", tc.dsn, err, tc.want, out.String())
			}
			if strings.Contains(out.String(), "wrong") {
				t.Fatalf("the password is in the output:\n%s", out.String())
			}
			t.Logf("DATABASE_URL=%q: exited after %s: %s", tc.dsn, time.Since(began).Round(time.Millisecond), strings.TrimSpace(out.String()))
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			t.Fatalf("DATABASE_URL=%q: still running after 30s:\n%s", tc.dsn, out.String())
		}
	}
}

// Two replicas: one works; SIGTERM hands over to the other.
func TestQuickstartHandsOver(t *testing.T) {
	srv := shared.Get(t)
	bin := build(t)
	var outs [2]*lockedBuffer
	var cmds [2]*exec.Cmd
	for i := range cmds {
		outs[i] = &lockedBuffer{}
		cmds[i] = exec.Command(bin)
		cmds[i].Env = append(os.Environ(), "DATABASE_URL="+srv.DSN())
		cmds[i].Stdout, cmds[i].Stderr = outs[i], outs[i]
		if err := cmds[i].Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmds[i].Process.Kill(); cmds[i].Wait() })
	}
	leaderOf := func() int {
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			for i, o := range outs {
				if strings.Contains(o.String(), " leads") && strings.Contains(o.String(), "working") {
					return i
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("no replica works:\n%s\n---\n%s", outs[0], outs[1])
		return -1
	}
	first := leaderOf()
	if err := cmds[first].Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmds[first].Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("the leader exited with %v after SIGTERM:\n%s", err, outs[first])
		}
	case <-time.After(time.Minute):
		cmds[first].Process.Kill()
		<-exited
		t.Fatalf("the leader still ran a minute after SIGTERM:\n%s", outs[first])
	}
	other := outs[1-first]
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(other.String(), " leads") {
		if time.Now().After(deadline) {
			t.Fatalf("the other replica never took over:\n%s", other)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(outs[first].String(), "stepped down") {
		t.Fatalf("the first leader did not step down gracefully:\n%s", outs[first])
	}
}

// The README's Quick start is this file, verbatim: a newcomer who copies
// it from there gets the program these tests build and run.
func TestReadmeQuotesThisFile(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Skipf("no README beside the module (a copy of the example): %v", err)
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(readme), "## Quick start")
	if !ok {
		t.Fatal("README has no Quick start section")
	}
	_, block, ok := strings.Cut(after, "```go\n")
	if !ok {
		t.Fatal("README's Quick start has no Go block")
	}
	block, _, _ = strings.Cut(block, "```")
	if block != string(src) {
		t.Fatal("README's Quick start differs from examples/quickstart/main.go: paste the file into it")
	}
}
