package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/group"
	"github.com/pgleader/pgleader/inspect"
	"github.com/pgleader/pgleader/internal/harness/proc"
	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/leader"
)

var (
	bin    string // the built CLI
	shared testpg.Shared
)

func server(t testing.TB) *testpg.Server { return shared.Get(t) }

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pgleader-cli-")
	if err != nil {
		panic(err)
	}
	bin = filepath.Join(dir, "pgleader")
	gobin, err := exec.LookPath("go")
	if err != nil {
		fmt.Fprintf(os.Stderr, "build the CLI: no go on PATH: %v\n", err)
		os.Exit(1)
	}
	if out, err := exec.Command(gobin, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build the CLI: %v\n%s", err, out)
		os.Exit(1)
	}
	code := testpg.Main(m, nil, &shared)
	os.RemoveAll(dir)
	os.Exit(code)
}

const waitLong = 30 * time.Second

// cli runs the binary to completion and returns its exit code and output.
func cli(t *testing.T, env []string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	done := make(chan struct{})
	timer := time.AfterFunc(2*waitLong, func() { cmd.Process.Kill() })
	defer timer.Stop()
	err := cmd.Run()
	close(done)
	return exitStatus(err), out.String()
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  []string
		code int
		want string
	}{
		{nil, nil, exitUsage, "Usage"},
		{[]string{"frobnicate"}, nil, exitUsage, "unknown command"},
		{[]string{"lock", "--dsn", "postgres://x@127.0.0.1:1/db"}, nil, exitUsage, "missing NAME"},
		{[]string{"lock", "--dsn", "postgres://x@127.0.0.1:1/db", "name"}, nil, exitUsage, "missing COMMAND"},
		{[]string{"status"}, []string{"DATABASE_URL="}, exitUsage, "no database"},
		{[]string{"lock", "--help"}, nil, exitOK, "Examples"},
		{[]string{"status", "--dsn", "postgres://u:hunter2@127.0.0.1:1/db?connect_timeout=2"}, nil, exitError, "failed to connect"},
		{[]string{"elect", "--dsn", "postgres://x@127.0.0.1:1/db", "name", "--", "/nonexistent/cmd"}, nil, exitError, "cannot start"},
		{[]string{"elect", "--dsn", "postgres://x@127.0.0.1:1/db", "--strategy", "latest", "name", "--", "sh"}, nil, exitUsage, "--strategy must be priority, newest or oldest"},
		{[]string{"elect", "--dsn", "postgres://x@127.0.0.1:1/db", "--strategy", "newest", "name", "--", "sh"}, nil, exitUsage, "Version: required with Strategy NewestVersion"},
	} {
		code, out := cli(t, tc.env, tc.args...)
		if code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("pgleader %v: exit %d, want %d; output %q should contain %q", tc.args, code, tc.code, out, tc.want)
		}
		if strings.Contains(out, "hunter2") {
			t.Errorf("pgleader %v: password in output: %s", tc.args, out)
		}
	}
}

// No subcommand's --help, and no mistyped flag, shows a password: --dsn
// has no default in the flag set ($DATABASE_URL is read after parsing),
// and a bad flag is a usage error (exit 2).
func TestNoSecretInUsage(t *testing.T) {
	env := []string{"DATABASE_URL=postgres://app:hunter2@db.example:5432/app"}
	for _, sub := range []string{"status", "lock", "elect", "resign", "history", "demo", "version"} {
		for _, tc := range []struct {
			args []string
			code int
		}{
			{[]string{sub, "--help"}, exitOK},
			{[]string{sub, "--bogus"}, exitUsage},
			{[]string{sub, "--dsn", "postgres://u:hunter2@h/db", "--bogus"}, exitUsage},
		} {
			code, out := cli(t, env, tc.args...)
			if code != tc.code {
				t.Errorf("pgleader %v: exit %d, want %d: %s", tc.args, code, tc.code, out)
			}
			if strings.Contains(out, "hunter2") {
				t.Errorf("pgleader %v prints the password: %s", tc.args, out)
			}
		}
	}
}

// lock: one run, exit 75 while held, the exit code passed through, --wait.
func TestLock(t *testing.T) {
	dsn := server(t).DSN()
	dir := t.TempDir()
	fifo := filepath.Join(dir, "release")
	if err := mkfifo(fifo); errors.Is(err, errors.ErrUnsupported) {
		t.Skip("no named pipes on this system")
	} else if err != nil {
		t.Fatal(err)
	}
	started := filepath.Join(dir, "started")
	holder := exec.Command(bin, "lock", "--dsn", dsn, "--identity", "holder", "job", "--",
		"sh", "-c", fmt.Sprintf("touch %s; read x < %s; exit 3", started, fifo))
	var hout bytes.Buffer
	holder.Stdout, holder.Stderr = &hout, &hout
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	waitFile(t, started)

	code, out := cli(t, nil, "lock", "--dsn", dsn, "job", "--", "sh", "-c", "echo should-not-run")
	if code != exitLockHeld || strings.Contains(out, "should-not-run") || !strings.Contains(out, "held by holder") {
		t.Fatalf("second lock: exit %d, output %q", code, out)
	}
	// A waiter runs once the holder is done.
	waiter := exec.Command(bin, "lock", "--dsn", dsn, "--wait", "30s", "job", "--", "sh", "-c", "echo waited-and-ran")
	var wout bytes.Buffer
	waiter.Stdout, waiter.Stderr = &wout, &wout
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	waitWaiting(t, dsn, leader.KeyFromName("job"))
	if err := os.WriteFile(fifo, []byte("go\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code := exitStatus(holder.Wait()); code != 3 {
		t.Fatalf("holder: exit %d, want the command's 3; output %q", code, hout.String())
	}
	if code := exitStatus(waiter.Wait()); code != 0 || !strings.Contains(wout.String(), "waited-and-ran") {
		t.Fatalf("waiter: exit %d, output %q", code, wout.String())
	}
}

// lock -n 2: two commands run at once, each told its slot; a third exits
// 75; -n 0 is a usage error.
func TestLockSlots(t *testing.T) {
	dsn := server(t).DSN()
	dir := t.TempDir()
	for _, slot := range []string{"0", "1"} {
		if err := mkfifo(filepath.Join(dir, "release-"+slot)); errors.Is(err, errors.ErrUnsupported) {
			t.Skip("no named pipes on this system")
		} else if err != nil {
			t.Fatal(err)
		}
	}
	script := fmt.Sprintf(`touch %[1]s/started-$PGLEADER_SLOT; read x < %[1]s/release-$PGLEADER_SLOT`, dir)
	var holders []*exec.Cmd
	for i, slot := range []string{"0", "1"} {
		h := exec.Command(bin, "lock", "--dsn", dsn, "-n", "2", "--identity", fmt.Sprintf("holder-%d", i), "backfill", "--", "sh", "-c", script)
		if err := h.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Process.Kill(); h.Wait() })
		holders = append(holders, h)
		waitFile(t, filepath.Join(dir, "started-"+slot))
	}
	code, out := cli(t, nil, "lock", "--dsn", dsn, "-n", "2", "backfill", "--", "sh", "-c", "echo should-not-run")
	if code != exitLockHeld || strings.Contains(out, "should-not-run") {
		t.Fatalf("third of two slots: exit %d, output %q", code, out)
	}
	if code, out := cli(t, nil, "lock", "--dsn", dsn, "-n", "0", "backfill", "--", "true"); code != exitUsage || !strings.Contains(out, "-n must be between 1") {
		t.Fatalf("-n 0: exit %d, output %q", code, out)
	}
	for i, slot := range []string{"0", "1"} {
		if err := os.WriteFile(filepath.Join(dir, "release-"+slot), []byte("go\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if code := exitStatus(holders[i].Wait()); code != 0 {
			t.Fatalf("holder %d: exit %d", i, code)
		}
	}
}

// elect: the command runs on the leader only, and moves to the other
// replica when the leader is killed.
func TestElectHandsOver(t *testing.T) {
	dsn := server(t).DSN()
	dir := t.TempDir()
	log := filepath.Join(dir, "runs")
	start := func(id string) *exec.Cmd {
		cmd := exec.Command(bin, "elect", "--dsn", dsn, "--identity", id, "--renew-interval", "100ms",
			"--renew-deadline", "500ms", "--lease", "1500ms", "svc", "--",
			"sh", "-c", fmt.Sprintf("echo %s >> %s; exec sleep 600", id, log))
		proc.Prepare(cmd, proc.Options{DeathSignal: syscall.SIGKILL})
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	a := start("replica-a")
	waitLines(t, log, 1)
	b := start("replica-b")
	waitWaiting(t, dsn, leader.KeyFromName("svc"))
	first := strings.TrimSpace(readFile(t, log))
	victim, heir := a, "replica-b"
	if first == "replica-b" {
		victim, heir = b, "replica-a"
	}
	victim.Process.Kill()
	victim.Wait()
	lines := waitLines(t, log, 2)
	if lines[1] != heir {
		t.Fatalf("runs %v; want %s to run the command after the kill", lines, heir)
	}
	// The killed supervisor's command died with it (its watchdog kills the
	// command's process group): only one sleep runs.
	deadline := time.Now().Add(waitLong)
	for n := countProcs(t, "sleep 600"); n != 1; n = countProcs(t, "sleep 600") {
		if time.Now().After(deadline) {
			t.Fatalf("%d commands running after the handover, want 1", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// status --json shows the holder and the waiters, and the name.
func TestStatusJSON(t *testing.T) {
	s := server(t)
	ctx := context.Background()
	key := leader.KeyFromName("status-test")
	args, vals := key.SQLArgs(1)
	connAs := func(app string) *pgx.Conn {
		c, err := pgx.Connect(ctx, s.DSN()+"&application_name="+app)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	if _, err := connAs("status-holder").Exec(ctx, "SELECT pg_advisory_lock("+args+")", vals...); err != nil {
		t.Fatal(err)
	}
	w := connAs("status-waiter")
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); w.Exec(wctx, "SELECT pg_advisory_lock("+args+")", vals...) }()
	defer func() { cancel(); <-done }()
	waitWaiting(t, s.DSN(), key)
	code, out := cli(t, nil, "status", "--dsn", s.DSN(), "--json", "--name", "status-test")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	var locks []lockStatus
	if err := json.Unmarshal([]byte(out), &locks); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for _, l := range locks {
		if l.Name == "status-test" {
			if l.Holder == nil || l.Holder.Identity != "status-holder" || len(l.Waiters) != 1 || l.Waiters[0].Identity != "status-waiter" {
				t.Fatalf("status: %s", out)
			}
			code, out = cli(t, nil, "status", "--dsn", s.DSN(), "--name", "status-test")
			if code != 0 || !strings.Contains(out, "status-holder") || !strings.Contains(out, "status-waiter") {
				t.Fatalf("table: %s", out)
			}
			return
		}
	}
	t.Fatalf("lock not listed: %s", out)
}

func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(waitLong)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never appeared", path)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func readFile(t *testing.T, path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

func waitLines(t *testing.T, path string, n int) []string {
	t.Helper()
	deadline := time.Now().Add(waitLong)
	for {
		lines := strings.Fields(readFile(t, path))
		if len(lines) >= n {
			return lines
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s has %d lines, want %d", path, len(lines), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitWaiting(t *testing.T, dsn string, key leader.Key) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := testpg.WaitWaiter(context.Background(), conn, key, ""); err != nil {
		t.Fatal(err)
	}
}

func countProcs(t *testing.T, cmdline string) int {
	t.Helper()
	n := 0
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.ReplaceAll(strings.TrimRight(string(b), "\x00"), "\x00", " ") == cmdline {
			n++
		}
	}
	return n
}

// demo runs its three handovers against a given server.
func TestDemo(t *testing.T) {
	code, out := cli(t, nil, "demo", "--dsn", server(t).DSN())
	if code != 0 {
		t.Fatalf("demo: exit %d\n%s", code, out)
	}
	for _, want := range []string{"after the resign", "after the SIGKILL", "after the pg_terminate_backend", "handover times"} {
		if !strings.Contains(out, want) {
			t.Fatalf("demo output lacks %q:\n%s", want, out)
		}
	}
	t.Log(out)
}

// elect with a command that drains for more than twice the lease on
// SIGTERM: the supervisor keeps the lock, renewed, until the command has
// exited, so the other replica's command starts only after it.
func TestElectKeepsLockWhileCommandDrains(t *testing.T) {
	dsn := server(t).DSN()
	dir := t.TempDir()
	log := filepath.Join(dir, "runs")
	// On SIGTERM: ignore further TERMs (the supervisor forwards its own
	// signal too) and drain for 3.5 s, more than twice the 1.5 s lease.
	script := `echo start-$ID >> "$LOG"
trap 'trap "" TERM; i=0; while [ $i -lt 35 ]; do sleep 0.1; i=$((i+1)); done; echo end-$ID >> "$LOG"; exit 0' TERM
while :; do sleep 0.1; done`
	start := func(id string) *exec.Cmd {
		cmd := exec.Command(bin, "elect", "--dsn", dsn, "--identity", id, "--renew-interval", "100ms",
			"--renew-deadline", "500ms", "--lease", "1500ms", "--grace", "10s", "drainsvc", "--", "sh", "-c", script)
		cmd.Env = append(os.Environ(), "ID="+id, "LOG="+log)
		proc.Prepare(cmd, proc.Options{DeathSignal: syscall.SIGKILL})
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	a := start("drain-a")
	waitLines(t, log, 1)
	b := start("drain-b")
	waitWaiting(t, dsn, leader.KeyFromName("drainsvc"))
	first := strings.TrimSpace(readFile(t, log))
	victim, victimID, heirID := a, "drain-a", "drain-b"
	if first == "start-drain-b" {
		victim, victimID, heirID = b, "drain-b", "drain-a"
	}
	victim.Process.Signal(syscall.SIGTERM)
	lines := waitLines(t, log, 3)
	want := []string{"start-" + victimID, "end-" + victimID, "start-" + heirID}
	if strings.Join(lines[:3], " ") != strings.Join(want, " ") {
		t.Fatalf("runs %v; want %v: the heir's command started before the drain ended", lines, want)
	}
	if err := victim.Wait(); err != nil {
		t.Fatalf("the stopped supervisor: %v", err)
	}
}

// status shows an election's standing candidates: the leader, the two heirs
// queued on the lock, and the watchers from the key's roster, and none of
// pgleader's own roster and slot locks as locks of their own.
func TestStatusShowsWatchers(t *testing.T) {
	s := server(t)
	ctx, cancel := context.WithCancel(context.Background())
	key := leader.KeyFromName("status-watchers")
	done := make(chan struct{}, 5)
	for i := 0; i < 5; i++ {
		e, err := elector.New(elector.Config{Connect: elector.DSN(s.DSN()), Key: key, Identity: fmt.Sprintf("sw-%d", i),
			Callbacks: elector.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) { <-ctx.Done() }}})
		if err != nil {
			t.Fatal(err)
		}
		go func() { e.Run(ctx); done <- struct{}{} }()
	}
	defer func() {
		cancel()
		for i := 0; i < 5; i++ {
			<-done
		}
	}()
	deadline := time.Now().Add(waitLong)
	for {
		code, out := cli(t, nil, "status", "--dsn", s.DSN(), "--json", "--name", "status-watchers")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, out)
		}
		var locks []lockStatus
		if err := json.Unmarshal([]byte(out), &locks); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		for _, l := range locks {
			if strings.HasPrefix(l.Key, fmt.Sprint(uint32(lockconn.Space))) {
				t.Fatalf("pgleader's own lock listed: %s", out)
			}
		}
		for _, l := range locks {
			if l.Name == "status-watchers" && l.Holder != nil && len(l.Waiters) == 2 && len(l.Watching) == 2 {
				_, table := cli(t, nil, "status", "--dsn", s.DSN(), "--name", "status-watchers")
				if !strings.Contains(table, "+2 watching") {
					t.Fatalf("table: %s", table)
				}
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("never 1 leader, 2 heirs and 2 watchers: %s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A supervised command's own children die with a SIGKILLed supervisor: the
// whole process group goes, not only the shell it started.
func TestElectKilledTakesGrandchildren(t *testing.T) {
	dsn := server(t).DSN()
	pidFile := filepath.Join(t.TempDir(), "grandchild")
	cmd := exec.Command(bin, "elect", "--dsn", dsn, "--identity", "grand", "orphansvc", "--",
		"sh", "-c", `sleep 300 & echo $! > "$PIDFILE"; wait`)
	cmd.Env = append(os.Environ(), "PIDFILE="+pidFile)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFile(t, pidFile)
	var pid int
	deadline := time.Now().Add(waitLong)
	for {
		if _, err := fmt.Sscan(readFile(t, pidFile), &pid); err == nil && pid > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no grandchild pid")
		}
		time.Sleep(10 * time.Millisecond)
	}
	gc, _ := os.FindProcess(pid)
	defer gc.Kill()
	cmd.Process.Kill()
	cmd.Wait()
	for {
		if !alive(gc) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the grandchild (pid %d) outlived the SIGKILLed supervisor", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// status NAME shows one election and exits 3 when nobody leads it; keys
// sort as numbers; version prints the build's version.
func TestStatusOneNameOrderAndVersion(t *testing.T) {
	s := server(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, s.DSN()+"&application_name=order-holder")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, k := range []int64{1000001, 1000010, 1000002, 1000100} {
		if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", k); err != nil {
			t.Fatal(err)
		}
	}
	code, out := cli(t, nil, "status", "--dsn", s.DSN(), "--json")
	var locks []lockStatus
	if err := json.Unmarshal([]byte(out), &locks); code != 0 || err != nil {
		t.Fatalf("exit %d, %v: %s", code, err, out)
	}
	var got []string
	for _, l := range locks {
		switch l.Key {
		case "1000001", "1000002", "1000010", "1000100":
			got = append(got, l.Key)
		}
	}
	if strings.Join(got, " ") != "1000001 1000002 1000010 1000100" {
		t.Fatalf("keys in the order %v, want numeric", got)
	}
	code, out = cli(t, nil, "status", "--dsn", s.DSN(), "nobody-leads-this")
	if code != exitNoLeader || !strings.Contains(out, "nobody-leads-this: NO LEADER (0 waiting, 0 watching)") {
		t.Fatalf("status of a free name: exit %d, %q", code, out)
	}
	named := leader.KeyFromName("held-by-name")
	args, vals := named.SQLArgs(1)
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock("+args+")", vals...); err != nil {
		t.Fatal(err)
	}
	code, out = cli(t, nil, "status", "--dsn", s.DSN(), "held-by-name")
	if code != 0 || !strings.Contains(out, "order-holder") || strings.Contains(out, "1000001") {
		t.Fatalf("status of a held name: exit %d, %q", code, out)
	}
	// A shared hold is no leader: status says nobody leads, and who
	// blocks the election.
	shared := leader.KeyFromName("held-shared")
	args, vals = shared.SQLArgs(1)
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock_shared("+args+")", vals...); err != nil {
		t.Fatal(err)
	}
	code, out = cli(t, nil, "status", "--dsn", s.DSN(), "held-shared")
	if code != exitNoLeader || !strings.Contains(out, "NO LEADER") || !strings.Contains(out, "held shared by order-holder(") {
		t.Fatalf("status of a name held shared: exit %d, %q", code, out)
	}
	if code, out := cli(t, nil, "version"); code != 0 || !strings.HasPrefix(out, "pgleader ") {
		t.Fatalf("version: exit %d, %q", code, out)
	}
}

// pgleader resign hands over between two elect supervisors, to any and to
// a named one, and gives clear exit codes.
func TestResign(t *testing.T) {
	dsn := server(t).DSN()
	dir := t.TempDir()
	log := filepath.Join(dir, "runs")
	for _, id := range []string{"r-a", "r-b", "r-c"} {
		cmd := exec.Command(bin, "elect", "--dsn", dsn, "--identity", id, "resignable", "--",
			"sh", "-c", fmt.Sprintf("echo %s >> %s; exec sleep 600", id, log))
		proc.Prepare(cmd, proc.Options{DeathSignal: syscall.SIGKILL})
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	}
	first := waitLines(t, log, 1)[0]
	waitWaiting(t, dsn, leader.KeyFromName("resignable"))
	resign := func(args ...string) (string, int) {
		out, err := exec.Command(bin, append([]string{"resign", "--dsn", dsn}, args...)...).CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), code
	}
	out, code := resign("resignable")
	if code != 0 || !strings.Contains(out, first+" handed over to") {
		t.Fatalf("resign: exit %d: %s", code, out)
	}
	t.Log(strings.TrimSpace(out))
	second := waitLines(t, log, 2)[1]
	var third string
	for _, id := range []string{"r-a", "r-b", "r-c"} {
		if id != first && id != second {
			third = id
		}
	}
	out, code = resign("resignable", "--to", third)
	if code != 0 || !strings.Contains(out, "handed over to "+third) {
		t.Fatalf("resign --to %s: exit %d: %s", third, code, out)
	}
	t.Log(strings.TrimSpace(out))
	if got := waitLines(t, log, 3)[2]; got != third {
		t.Fatalf("%s ran the command, want %s", got, third)
	}
	if out, code = resign("resignable", "--to", "nobody"); code != exitRefused {
		t.Fatalf("resign --to nobody: exit %d: %s", code, out)
	}
	if out, code = resign("nothing-here"); code != exitNoLeader || !strings.Contains(out, "NO LEADER") {
		t.Fatalf("resign of a free name: exit %d: %s", code, out)
	}
}

// elect --fencing --listen: the command gets its term; the supervisor
// serves probes, status and metrics, and POST /resign with
// --allow-resign; pgleader history then shows both terms and why the
// first ended.
func TestElectListenFencingHistory(t *testing.T) {
	dsn := server(t).DSN()
	dir := t.TempDir()
	log := filepath.Join(dir, "terms")
	name := fmt.Sprintf("listened-%d", time.Now().UnixNano())
	urls := map[string]string{}
	for _, id := range []string{"l-a", "l-b"} {
		urls[id] = "http://" + serve(t, "/metrics on ", "elect", "--dsn", dsn, "--identity", id, "--fencing", "--listen", "127.0.0.1:0", "--allow-resign", name, "--",
			"sh", "-c", fmt.Sprintf(`echo "$PGLEADER_IDENTITY,$PGLEADER_TERM,$PGLEADER_TERMS_TABLE" >> %s; exec sleep 600`, log))
	}
	first := strings.Split(waitLines(t, log, 1)[0], ",")
	// A new name: its first term; the table as the elector found it, with
	// its schema, so that the command's own connection finds the same one.
	if len(first) != 3 || first[1] != "1" || first[2] != "public.pgleader_terms" {
		t.Fatalf("the command's environment: %q", first)
	}
	get := func(url string) (int, string) {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for id, u := range urls {
		if code, body := get(u + "/readyz"); code != 200 {
			t.Fatalf("%s /readyz: %d %s", id, code, body)
		}
	}
	if code, body := get(urls[first[0]] + "/metrics"); code != 200 || !strings.Contains(body, "pgleader_is_leader{") || !strings.Contains(body, "pgleader_build_info") {
		t.Fatalf("/metrics: %d\n%s", code, body)
	}
	resp, err := http.Post(urls[first[0]]+"/resign", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("POST /resign: %d", resp.StatusCode)
	}
	second := strings.Split(waitLines(t, log, 2)[1], ",")
	if second[0] == first[0] || second[1] != "2" {
		t.Fatalf("after the resign: %q", second)
	}
	var out []byte
	eventually(t, "history shows the resigned term", func() (bool, string) {
		out, err = exec.Command(bin, "history", "--dsn", dsn, name).CombinedOutput()
		return err == nil && strings.Contains(string(out), "resigned") && strings.Contains(string(out), "(leads)"), string(out)
	})
	t.Logf("pgleader history listened:\n%s", out)
	// status shows the last handover and how long the follower has stood.
	out, _ = exec.Command(bin, "status", "--dsn", dsn, name).CombinedOutput()
	if !strings.Contains(string(out), "LAST HANDOVER") || !strings.Contains(string(out), "from "+first[0]+" (resigned)") {
		t.Fatalf("status listened:\n%s", out)
	}
	t.Logf("pgleader status listened:\n%s", out)
	out, err = exec.Command(bin, "status", "--dsn", dsn, "--json", name).Output()
	if err != nil {
		t.Fatal(err)
	}
	type candidate struct {
		Identity      string     `json:"identity"`
		StandingSince *time.Time `json:"standing_since"`
	}
	var st struct {
		Waiters  []candidate `json:"waiters"`
		Watching []candidate `json:"watching"`
	}
	// The resigned leader queues as an heir or watches, depending on
	// whether it has taken a slot yet: either way it has stood since its
	// session began.
	err = json.Unmarshal(out, &st)
	if all := append(st.Waiters, st.Watching...); err != nil || len(all) != 1 || all[0].Identity != first[0] || all[0].StandingSince == nil {
		t.Fatalf("the follower's standing age: %v %s", err, out)
	}
	out, err = exec.Command(bin, "history", "--dsn", dsn, "--json", name).Output()
	if err != nil {
		t.Fatal(err)
	}
	var rows []map[string]any
	if err := json.Unmarshal(out, &rows); err != nil || len(rows) != 2 || rows[0]["reason"] != "resigned" {
		t.Fatalf("history --json: %v %s", err, out)
	}
}

// serve starts the CLI with args, waits until its stderr says where it
// serves (the text after marker), and returns that; the process is killed
// at cleanup.
func serve(t *testing.T, marker string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	proc.Prepare(cmd, proc.Options{DeathSignal: syscall.SIGKILL})
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addrs := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if _, addr, ok := strings.Cut(sc.Text(), marker); ok {
				select {
				case addrs <- addr:
				default:
				}
			}
		}
	}()
	return recvLine(t, addrs)
}

func recvLine(t *testing.T, ch <-chan string) string {
	t.Helper()
	select {
	case s := <-ch:
		return s
	case <-time.After(waitLong):
		t.Fatal("timed out")
		return ""
	}
}

func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(waitLong)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s; last: %s", what, waitLong, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// status shows a group as one line: its key count, the keys nobody leads,
// and each member with the keys it leads; the keys themselves are not
// listed one by one, and --json marks them with the group's name.
func TestStatusShowsGroups(t *testing.T) {
	s := server(t)
	ctx, cancel := context.WithCancel(context.Background())
	var keys []leader.Key
	for i := range 7 {
		keys = append(keys, leader.KeyFromName(fmt.Sprintf("status-group/%d", i)))
	}
	// One key is held by another session: the group cannot lead it.
	args, vals := keys[6].SQLArgs(1)
	other, err := pgx.Connect(ctx, s.DSN()+"&application_name=squatter")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.Background())
	if _, err := other.Exec(ctx, "SELECT pg_advisory_lock("+args+")", vals...); err != nil {
		t.Fatal(err)
	}
	var groups []*group.Group
	done := make(chan struct{}, 2)
	for _, id := range []string{"sg-a", "sg-b"} {
		g, err := group.New(group.Config{Connect: leader.DSN(s.DSN()), Group: "status group", Keys: keys, Identity: id,
			Value:         []byte("at-" + id),
			RenewInterval: 100 * time.Millisecond, RenewDeadline: 500 * time.Millisecond, LeaseDuration: 1500 * time.Millisecond,
			Callbacks: group.Callbacks{OnElected: func(ctx context.Context, l leader.Leadership) { <-ctx.Done() }}})
		if err != nil {
			t.Fatal(err)
		}
		groups = append(groups, g)
		go func() { g.Run(ctx); done <- struct{}{} }()
	}
	defer func() {
		cancel()
		<-done
		<-done
	}()
	deadline := time.Now().Add(time.Minute)
	for len(groups[0].Owned())+len(groups[1].Owned()) != 6 || len(groups[0].Members()) != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("owned %v and %v", groups[0].Owned(), groups[1].Owned())
		}
		time.Sleep(20 * time.Millisecond)
	}
	var out string
	for time.Now().Before(deadline) {
		var code int
		code, out = cli(t, nil, "status", "--dsn", s.DSN())
		if code != 0 {
			t.Fatalf("exit %d: %s", code, out)
		}
		if regexp.MustCompile(`status group +7 +1 +sg-a\(\d+\) [34], sg-b\(\d+\) [34]`).MatchString(out) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !regexp.MustCompile(`status group +7 +1 +sg-a\(\d+\) [34], sg-b\(\d+\) [34]`).MatchString(out) || strings.Contains(out, "sg-a  ") ||
		!strings.Contains(out, "squatter") {
		t.Fatalf("status:\n%s", out)
	}
	t.Logf("status:\n%s", out)
	_, js := cli(t, nil, "status", "--dsn", s.DSN(), "--json")
	var locks []lockStatus
	if err := json.Unmarshal([]byte(js), &locks); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range locks {
		if l.Group == "status group" {
			n++
			// Each member's value, on every key it leads.
			if l.Holder == nil || l.Holder.Value == nil || *l.Holder.Value != "at-"+l.Holder.Identity {
				t.Fatalf("key %s of the group: holder %+v without its member's value: %s", l.Key, l.Holder, js)
			}
		}
	}
	if n != 6 {
		t.Fatalf("%d keys marked with the group in --json: %s", n, js)
	}
}

// Values from the database reach the terminal quoted when they hold
// anything but printable characters: a group name in a session's marker
// (any session can write one) and a key's name in the terms table (any
// writer of it can) cannot clear the screen, set the title or forge a line.
func TestStatusQuotesWhatTheDatabaseSays(t *testing.T) {
	s := server(t)
	ctx := context.Background()
	c, err := pgx.Connect(ctx, s.DSN()+"&application_name=marker")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	group := "g\x1b[2J\nforged line"
	key := leader.KeyFromName(t.Name())
	args, vals := key.SQLArgs(1)
	rc, ro := inspect.GroupRoster(group)
	classid, objid, objsubid := key.LockTag()
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{leader.TermsTableSQL(leader.DefaultTermsTable), nil},
		{"INSERT INTO pgleader_terms VALUES ($1, $2, $3, $4, 1, 'marker', now())", []any{classid, objid, objsubid, "k\x1b]0;pwned\x07(1)"}},
		{"SELECT pg_advisory_lock_shared($1::int4, $2::int4)", []any{int32(rc), int32(ro)}},
		{"SELECT 'pgleader group v1 " + hex.EncodeToString([]byte(group)) + " 3'", nil},
	} {
		if _, err := c.Exec(ctx, q.sql, q.args...); err != nil {
			t.Fatal(err)
		}
	}
	holder, err := pgx.Connect(ctx, s.DSN()+"&application_name=holder")
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.Background())
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_lock("+args+")", vals...); err != nil {
		t.Fatal(err)
	}
	code, out := cli(t, nil, "status", "--dsn", s.DSN())
	if code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	for _, bad := range []string{"\x1b", "\x07", "\nforged"} {
		if strings.Contains(out, bad) {
			t.Fatalf("status printed %q raw:\n%q", bad, out)
		}
	}
	for _, want := range []string{`"g\x1b[2J\nforged line"`, `"k\x1b]0;pwned\a"`} {
		if !strings.Contains(out, want) {
			t.Fatalf("status does not show %s quoted:\n%s", want, out)
		}
	}
}

// An election without fencing still has its name: status (and the live
// page) read it from the leader's statements; history says it keeps none,
// and exits 1, instead of "no terms".
func TestUnfencedElectionIsNamed(t *testing.T) {
	dsn := server(t).DSN()
	name := fmt.Sprintf("nameless-%d", time.Now().UnixNano())
	cmd := exec.Command(bin, "elect", "--dsn", dsn, "--identity", "unfenced", name, "--", "sleep", "600")
	proc.Prepare(cmd, proc.Options{DeathSignal: syscall.SIGKILL})
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	key := leader.KeyFromName(name)
	deadline := time.Now().Add(waitLong)
	for {
		code, out := cli(t, nil, "status", "--dsn", dsn)
		if code == 0 && strings.Contains(out, name) && strings.Contains(out, "unfenced") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status does not name %s (key %s):\n%s", name, key, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	code, out := cli(t, nil, "history", "--dsn", dsn, name)
	if code != exitError || !strings.Contains(out, "no fencing term") {
		t.Fatalf("history of an unfenced election: exit %d: %s", code, out)
	}
}

// elect -n 2: two replicas of four run the command, each in a slot of its
// own ($PGLEADER_SLOT); when one is killed another takes its slot; status
// -n shows the slots.
func TestElectSlots(t *testing.T) {
	dsn := server(t).DSN()
	dir := t.TempDir()
	log := filepath.Join(dir, "runs")
	procs := map[string]*exec.Cmd{}
	for i := range 4 {
		id := fmt.Sprintf("slot-replica-%d", i)
		cmd := exec.Command(bin, "elect", "--dsn", dsn, "--identity", id, "-n", "2", "--renew-interval", "100ms",
			"--renew-deadline", "500ms", "--lease", "1500ms", "backfill", "--",
			"sh", "-c", fmt.Sprintf(`echo "$PGLEADER_IDENTITY=$PGLEADER_SLOT" >> %s; exec sleep 600`, log))
		proc.Prepare(cmd, proc.Options{DeathSignal: syscall.SIGKILL})
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		procs[id] = cmd
	}
	lines := waitLines(t, log, 2)
	slotOf := map[string]string{}
	for _, l := range lines {
		id, slot, _ := strings.Cut(l, "=")
		slotOf[id] = slot
	}
	name := func(l string) string { id, _, _ := strings.Cut(l, "="); return id }
	if len(slotOf) != 2 || slotOf[name(lines[0])] == slotOf[name(lines[1])] {
		t.Fatalf("runs %q: want two replicas in slots 0 and 1", lines)
	}
	status := func() []lockStatus {
		t.Helper()
		code, out := cli(t, nil, "status", "--dsn", dsn, "--json", "-n", "2", "backfill")
		var ls []lockStatus
		if err := json.Unmarshal([]byte(out[strings.Index(out, "["):]), &ls); err != nil || code != exitOK || len(ls) != 2 {
			t.Fatalf("status -n 2: exit %d, %v, output %s", code, err, out)
		}
		return ls
	}
	for i, l := range status() {
		if l.Holder == nil || slotOf[l.Holder.Identity] != fmt.Sprint(i) {
			t.Fatalf("status -n 2: slot %d held by %+v; the runs say %v", i, l.Holder, slotOf)
		}
	}
	// Kill the replica in slot 1: another takes slot 1, and only slot 1.
	victim := name(lines[0])
	if slotOf[victim] != "1" {
		victim = name(lines[1])
	}
	procs[victim].Process.Kill()
	procs[victim].Wait()
	third := strings.Split(waitLines(t, log, 3)[2], "=")
	if len(third) != 2 || third[1] != "1" || slotOf[third[0]] != "" {
		t.Fatalf("after the kill of %s (slot 1): %q ran; want a replica not yet running, in slot 1", victim, third)
	}
	if code, out := cli(t, nil, "status", "--dsn", dsn, "-n", "2", "nobody-holds-this"); code != exitNoLeader || !strings.Contains(out, "NO SLOT LED (2 slots") {
		t.Fatalf("status -n 2 of an idle name: exit %d, output %q", code, out)
	}
	for _, args := range [][]string{
		{"status", "--dsn", dsn, "-n", "2"},
		{"elect", "--dsn", dsn, "-n", "0", "backfill", "--", "true"},
		{"elect", "--dsn", dsn, "-n", "65", "backfill", "--", "true"},
	} {
		if code, out := cli(t, nil, args...); code != exitUsage {
			t.Errorf("pgleader %v: exit %d, want %d (%s)", args[:len(args)-1], code, exitUsage, out)
		}
	}
}

// alive reports whether p still runs. Signal 0 finds a zombie too, until
// its new parent reaps it, which a loaded machine's init may leave for a
// while: on Linux, /proc says when the process is only a zombie.
func alive(p *os.Process) bool {
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid)); err == nil {
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
			return b[i+2] != 'Z' && b[i+2] != 'X'
		}
	}
	return p.Signal(syscall.Signal(0)) == nil
}

// status shows the value a leader proclaimed (elector.Config.Value): in
// --json, as text for one NAME; a row that is not the holder's own (a
// stale pid) is not shown.
func TestStatusShowsValue(t *testing.T) {
	s := server(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	elected := make(chan struct{}, 1)
	e, err := elector.New(elector.Config{Connect: elector.DSN(s.DSN()), Key: leader.KeyFromName("status-value"), Identity: "valued-leader",
		Value: []byte("10.0.0.7:8080"),
		Callbacks: elector.Callbacks{OnElected: func(ctx context.Context, _ leader.Leadership) {
			elected <- struct{}{}
			<-ctx.Done()
		}}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() { cancel(); <-done }()
	<-elected
	var l lockStatus
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, out := cli(t, nil, "status", "--dsn", s.DSN(), "--json", "status-value")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, out)
		}
		if err := json.Unmarshal([]byte(out), &l); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if l.Holder != nil && l.Holder.Value != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no value within 30s: %s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if *l.Holder.Value != "10.0.0.7:8080" || l.Holder.Identity != "valued-leader" {
		t.Fatalf("holder %+v value %q", l.Holder, *l.Holder.Value)
	}
	if code, out := cli(t, nil, "status", "--dsn", s.DSN(), "status-value"); code != 0 || !strings.Contains(out, `value of valued-leader: "10.0.0.7:8080"`) {
		t.Fatalf("exit %d: %s", code, out)
	}
	c, o, ss := leader.KeyFromName("status-value").LockTag()
	if err := s.Exec(ctx, fmt.Sprintf("UPDATE %s SET backend_pid = backend_pid + 1 WHERE classid = %d AND objid = %d AND objsubid = %d", leader.DefaultValuesTable, c, o, ss)); err != nil {
		t.Fatal(err)
	}
	if code, out := cli(t, nil, "status", "--dsn", s.DSN(), "--json", "status-value"); code != 0 || strings.Contains(out, "10.0.0.7") {
		t.Fatalf("a row of another backend shown as the holder's value: exit %d: %s", code, out)
	}
}

// elect --value proclaims the leader's value: pgleader status shows it.
func TestElectValue(t *testing.T) {
	dsn := server(t).DSN()
	cmd := exec.Command(bin, "elect", "--dsn", dsn, "--identity", "valued-replica", "--value", "http://10.0.0.9:8080",
		"elect-value", "--", "sleep", "600")
	proc.Prepare(cmd, proc.Options{DeathSignal: syscall.SIGKILL})
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, out := cli(t, nil, "status", "--dsn", dsn, "--json", "elect-value")
		var l lockStatus
		if code == exitOK && json.Unmarshal([]byte(out), &l) == nil && l.Holder != nil && l.Holder.Value != nil {
			if l.Holder.Identity != "valued-replica" || *l.Holder.Value != "http://10.0.0.9:8080" {
				t.Fatalf("status: %s", out)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no value within 30s: exit %d, %s", code, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A ranked candidate's sessions carry its rank in their application_name
// (leader.Rank): status shows each session's identity and rank apart, and
// why the holder leads.
func TestStatusShowsRanks(t *testing.T) {
	s := server(t)
	ctx := context.Background()
	key := leader.KeyFromName("ranked-status")
	args, vals := key.SQLArgs(1)
	connAs := func(app string) *pgx.Conn { return testpg.ConnectAs(t, s.DSN(), app) }
	if _, err := connAs("ranked-holder [N0 1.0.0]").Exec(ctx, "SELECT pg_advisory_lock("+args+")", vals...); err != nil {
		t.Fatal(err)
	}
	w := connAs("ranked-waiter [N3 2.0.0]")
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); w.Exec(wctx, "SELECT pg_advisory_lock("+args+")", vals...) }()
	defer func() { cancel(); <-done }()
	waitWaiting(t, s.DSN(), key)
	code, out := cli(t, nil, "status", "--dsn", s.DSN(), "--json", "ranked-status")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	var l lockStatus
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if h := l.Holder; h == nil || h.Identity != "ranked-holder" || h.Rank == nil || *h.Rank != (rankStatus{Strategy: "NewestVersion", Version: "1.0.0"}) {
		t.Fatalf("holder: %s", out)
	}
	if len(l.Waiters) != 1 || l.Waiters[0].Identity != "ranked-waiter" || l.Waiters[0].Rank == nil ||
		*l.Waiters[0].Rank != (rankStatus{Strategy: "NewestVersion", Priority: 3, Version: "2.0.0"}) {
		t.Fatalf("waiters: %s", out)
	}
	if want := `a preferred candidate stands: ranked-waiter [N3 2.0.0] (NewestVersion: version "2.0.0" over "1.0.0")`; !strings.HasPrefix(l.Why, want) {
		t.Fatalf("why %q, want it to begin %q", l.Why, want)
	}
	code, out = cli(t, nil, "status", "--dsn", s.DSN(), "ranked-status")
	if code != 0 || !strings.Contains(out, "ranked-holder [N0 1.0.0]") || !strings.Contains(out, "ranked-waiter [N3 2.0.0](") ||
		!strings.Contains(out, "why ranked-holder [N0 1.0.0] leads ranked-status: a preferred candidate stands") {
		t.Fatalf("table: %s", out)
	}
}

// Why a holder leads: by its own strategy (an unranked one's is
// ByPriority at priority 0), over every candidate, waiting or watching.
func TestRankWhy(t *testing.T) {
	sess := func(app string) sessionStatus {
		var s sessionStatus
		s.parseApp(app)
		return s
	}
	for _, tt := range []struct {
		holder            string
		waiters, watching []string
		want              string
	}{
		{"a", []string{"b"}, nil, ""},
		{"a [P0]", nil, nil, "first come (no candidate stands)"},
		{"a [P2]", []string{"b [P1]"}, []string{"c"}, "preferred (ByPriority: priority 2 over 1)"},
		{"a [P1]", []string{"b"}, []string{"c [P2]"}, "a preferred candidate stands: c [P2] (ByPriority: priority 2 over 1)"},
		{"a", []string{"b [P1]"}, nil, "a preferred candidate stands: b [P1] (ByPriority: priority 1 over 0)"},
		{"a", []string{"b [P-1]"}, nil, "preferred (ByPriority: priority 0 over -1)"},
		{"a [P0]", []string{"b"}, nil, "first come"},
		{"a [O0 1.0.0]", []string{"b [O9 2.0.0]"}, nil, `preferred (OldestVersion: version "1.0.0" over "2.0.0")`},
		{"a [N0 1.0.0]", []string{"b [N0 1.0.0]", "c [N1 1.0.0]"}, nil, "a preferred candidate stands: c [N1 1.0.0] (NewestVersion: priority 1 over 0)"},
	} {
		ls := &lockStatus{}
		h := sess(tt.holder)
		ls.Holder = &h
		for _, w := range tt.waiters {
			ls.Waiters = append(ls.Waiters, sess(w))
		}
		for _, w := range tt.watching {
			ls.Watching = append(ls.Watching, sess(w))
		}
		if got := rankWhy(ls); !strings.HasPrefix(got, tt.want) || tt.want == "" && got != "" {
			t.Errorf("%s, waiting %v, watching %v: why %q, want %q", tt.holder, tt.waiters, tt.watching, got, tt.want)
		}
	}
}

// elect --priority: a replica of a higher priority that starts later is
// handed the lead (after its PreferredDelay), and status shows both ranks
// and why the leader leads.
func TestElectPreferredReplica(t *testing.T) {
	dsn := server(t).DSN()
	log := filepath.Join(t.TempDir(), "runs")
	start := func(id, prio string) {
		cmd := exec.Command(bin, "elect", "--dsn", dsn, "--identity", id, "--priority", prio, "--renew-interval", "100ms",
			"--renew-deadline", "500ms", "--lease", "1500ms", "--grace", "5s", "rankedsvc", "--", "sh", "-c", `echo start-$ID >> "$LOG"; exec sleep 600`)
		cmd.Env = append(os.Environ(), "ID="+id, "LOG="+log)
		proc.Prepare(cmd, proc.Options{DeathSignal: syscall.SIGKILL})
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	}
	start("rank-low", "1")
	waitLines(t, log, 1)
	start("rank-high", "2")
	if lines := waitLines(t, log, 2); strings.Join(lines[:2], " ") != "start-rank-low start-rank-high" {
		t.Fatalf("runs %v; want rank-low, then rank-high", lines)
	}
	deadline := time.Now().Add(waitLong)
	for {
		code, out := cli(t, nil, "status", "--dsn", dsn, "--json", "rankedsvc")
		var l lockStatus
		if code == 0 && json.Unmarshal([]byte(out), &l) == nil && l.Holder != nil && l.Holder.Identity == "rank-high" && len(l.Waiters)+len(l.Watching) == 1 {
			if l.Holder.Rank == nil || l.Holder.Rank.Priority != 2 || l.Why != "preferred (ByPriority: priority 2 over 1)" {
				t.Fatalf("status: %s", out)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("status: exit %d: %s", code, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
