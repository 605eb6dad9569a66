package testpg

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pgleader/pgleader/internal/harness/fleet"
	"github.com/pgleader/pgleader/internal/harness/proc"
)

// ChildEnv is set in the environment of a child started by StartChild. Its
// value names the role the child plays; a TestMain dispatches on it.
const ChildEnv = "PGLEADER_TEST_CHILD"

// Mono, Event, Emitter and NewEmitter are the event protocol of child
// processes; it lives with the CLI's candidates, in internal/harness/fleet.
var (
	Mono       = fleet.Mono
	NewEmitter = fleet.NewEmitter
)

// Event is one line a child writes on its stdout; see fleet.Event.
type Event = fleet.Event

// Emitter writes Events from inside a child; see fleet.Emitter.
type Emitter = fleet.Emitter

// Child is a helper process: the test binary itself, run again with
// ChildEnv set. It reports Events on stdout and reads commands, one a line,
// on stdin.
type Child struct {
	t      testing.TB
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	events chan Event
	done   chan struct{}
	mu     sync.Mutex
	log    []Event
}

// StartChild starts the test binary again as a child playing role, with
// extra environment variables env ("K=V"). The child is killed at cleanup.
func StartChild(t testing.TB, role string, env ...string) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), ChildEnv+"="+role), env...)
	cmd.Stderr = &testWriter{t: t, prefix: role + ": "}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	release, err := proc.Start(cmd, proc.Options{DeathSignal: syscall.SIGKILL})
	if err != nil {
		t.Fatalf("start child %s: %v", role, err)
	}
	c := &Child{t: t, cmd: cmd, stdin: stdin, events: make(chan Event, 1024), done: make(chan struct{})}
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		defer close(c.events)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var e Event
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				continue // not an event: test framework output
			}
			c.mu.Lock()
			c.log = append(c.log, e)
			c.mu.Unlock()
			select {
			case c.events <- e:
			default: // nobody is waiting for that many events; Log keeps them
			}
		}
	}()
	go func() {
		<-readDone // Wait closes the pipe: read it to the end first
		cmd.Wait()
		release()
		close(c.done)
	}()
	t.Cleanup(func() {
		c.Resume()
		c.Signal(syscall.SIGKILL)
		<-c.done
	})
	return c
}

// Pid returns the child's process id.
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// Signal sends sig to the child.
func (c *Child) Signal(sig syscall.Signal) { proc.Signal(c.cmd.Process, sig) }

// Pause stops the child (SIGSTOP). On Windows, which cannot, it skips the
// test.
func (c *Child) Pause() {
	if err := proc.Stop(c.cmd.Process); errors.Is(err, proc.ErrUnsupported) {
		c.t.Skip("pausing a process (SIGSTOP) is not supported on this system")
	}
}

// Resume continues a paused child (SIGCONT).
func (c *Child) Resume() { proc.Cont(c.cmd.Process) }

// Send writes one command line to the child's stdin.
func (c *Child) Send(line string) error {
	_, err := fmt.Fprintln(c.stdin, line)
	return err
}

// CloseStdin closes the child's stdin (children take it as "stop").
func (c *Child) CloseStdin() error { return c.stdin.Close() }

// Done is closed when the child has exited.
func (c *Child) Done() <-chan struct{} { return c.done }

// Wait waits for the next event named ev, skipping others, until ctx ends.
func (c *Child) Wait(ctx context.Context, ev string) (Event, error) {
	return c.WaitAny(ctx, ev)
}

// WaitAny waits for the next event named any of evs, skipping others, until
// ctx ends.
func (c *Child) WaitAny(ctx context.Context, evs ...string) (Event, error) {
	for {
		select {
		case e, ok := <-c.events:
			if !ok {
				return Event{}, fmt.Errorf("child exited before event %q", evs)
			}
			for _, ev := range evs {
				if e.Ev == ev {
					return e, nil
				}
			}
		case <-ctx.Done():
			return Event{}, fmt.Errorf("waiting for child event %q: %w", evs, ctx.Err())
		}
	}
}

// WaitAfter waits until the child has reported an event named ev at or
// after the monotonic time since (see Mono), whether or not Wait consumed
// it, until ctx ends.
func (c *Child) WaitAfter(ctx context.Context, ev string, since int64) (Event, error) {
	for {
		for _, e := range c.Log() {
			if e.Ev == ev && e.Mono >= since {
				return e, nil
			}
		}
		select {
		case <-ctx.Done():
			return Event{}, fmt.Errorf("waiting for child event %q: %w", ev, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Log returns every event the child has reported so far.
func (c *Child) Log() []Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Event(nil), c.log...)
}

// WaitTimeout is Wait with a timeout.
func (c *Child) WaitTimeout(ev string, d time.Duration) (Event, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return c.Wait(ctx, ev)
}

type testWriter struct {
	t      testing.TB
	prefix string
	mu     sync.Mutex
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.t.Logf("%s%s", w.prefix, p)
	return len(p), nil
}

// UntilStdinCloses returns a context that ends when the child's stdin
// closes: the test's CloseStdin, or the test process ending.
func UntilStdinCloses() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer cancel()
		io.Copy(io.Discard, os.Stdin)
	}()
	return ctx, cancel
}
