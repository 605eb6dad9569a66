// Package fleet runs electors as separate OS processes for the CLI's demo
// and bench: the CLI binary starts itself again with the hidden
// "candidate" subcommand, which runs one elector, reports its callbacks as
// JSON lines on stdout (stamped with CLOCK_MONOTONIC, which every process
// on the machine shares) and takes commands on stdin.
package fleet

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/leader"

	"github.com/pgleader/pgleader/internal/harness/proc"
)

// Options configure one candidate.
type Options struct {
	DSN      string
	Key      string // a name for leader.KeyFromName
	ID       string
	Interval time.Duration // 0: the elector's defaults
	Deadline time.Duration
	Lease    time.Duration
	Fencing  bool
	// Renews makes the candidate report every successful renew ("renewed",
	// stamped with when the renew was sent).
	Renews bool
	// Bare runs no elector: the candidate waits in a bare
	// pg_advisory_lock, reports "elected" when it returns, and unlocks on
	// "resign". The bench's reference for the speed of a lock grant.
	Bare bool
	// Keys > 0 runs a member of the group.Group named Key, with Keys
	// keys (see GroupKeys); SingleConnection turns its crash watch off.
	Keys             int
	SingleConnection bool
}

// Args renders o as the candidate subcommand's arguments.
func (o Options) Args() []string {
	a := []string{"candidate", "--dsn", o.DSN, "--key", o.Key, "--id", o.ID}
	if o.Interval > 0 {
		a = append(a, "--interval", o.Interval.String(), "--deadline", o.Deadline.String(), "--lease", o.Lease.String())
	}
	if o.Fencing {
		a = append(a, "--fencing")
	}
	if o.Renews {
		a = append(a, "--renews")
	}
	if o.Bare {
		a = append(a, "--bare")
	}
	if o.Keys > 0 {
		a = append(a, "--keys", strconv.Itoa(o.Keys))
	}
	if o.SingleConnection {
		a = append(a, "--single-connection")
	}
	return a
}

// RunCandidate runs one elector until stdin says "exit" or closes, or ctx
// ends. It writes events to out and reads "resign" and "exit" from in.
func RunCandidate(ctx context.Context, o Options, in io.Reader, out io.Writer) error {
	em := NewEmitter(out)
	if o.Bare {
		return runBare(ctx, o, in, em)
	}
	if o.Keys > 0 {
		return runGroupMember(ctx, o, in, em)
	}
	// "ctxdone" is stamped when OnElected's context ends and written from
	// OnDemoted, before "demoted": a write to stdout on OnElected's way
	// out would sit on the handover's path (the unlock waits for OnElected
	// to return), where the bare reference writes nothing.
	ended := make(chan Event, 1)
	cfg := elector.Config{
		Connect:  elector.DSN(o.DSN),
		Key:      leader.KeyFromName(o.Key),
		Identity: o.ID,
		Callbacks: elector.Callbacks{
			OnElected: func(ctx context.Context, l leader.Leadership) {
				em.Emit(Event{Ev: "elected", Identity: o.ID, Term: l.Term})
				<-ctx.Done()
				ev := Event{Ev: "ctxdone", Mono: Mono(), Identity: o.ID, Term: l.Term, Err: leader.ReasonLabel(context.Cause(ctx))}
				select {
				case ended <- ev:
				default: // an earlier tenure's OnDemoted came first (ReleaseTimeout)
					em.Emit(ev)
				}
			},
			OnDemoted: func(l leader.Leadership, reason error) {
				select {
				case ev := <-ended:
					em.Emit(ev)
				default:
				}
				em.Emit(Event{Ev: "demoted", Identity: o.ID, Term: l.Term, Err: leader.ReasonLabel(reason)})
			},
		},
		RenewInterval: o.Interval, RenewDeadline: o.Deadline, LeaseDuration: o.Lease,
		Fencing: elector.Fencing{Enabled: o.Fencing},
	}
	if o.Renews {
		cfg.Observer = renewReporter{em: em, id: o.ID}
	}
	e, err := elector.New(cfg)
	if err != nil {
		return err
	}
	return serveCommands(ctx, o.ID, in, em, e.Run, func(ctx context.Context) { e.Resign(ctx) }, nil)
}

// serveCommands runs run until stdin says "exit" or closes, or ctx ends,
// between a "started" and an "exited" event. It answers "resign" with
// resign, and "stats" with a stats event: the heap, the process's CPU,
// then stats' fields, if any.
func serveCommands(ctx context.Context, id string, in io.Reader, em *Emitter, run func(context.Context) error,
	resign func(context.Context), stats func() string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	em.Emit(Event{Ev: "started", Identity: id, Data: strconv.Itoa(os.Getpid())})
	go func() {
		sc := bufio.NewScanner(in)
		for sc.Scan() {
			switch sc.Text() {
			case "resign":
				resign(ctx)
			case "exit":
				cancel()
				return
			case "stats":
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				data := fmt.Sprintf("%d %d", ms.HeapAlloc, proc.CPUTime())
				if stats != nil {
					data += " " + stats()
				}
				em.Emit(Event{Ev: "stats", Identity: id, Data: data})
			}
		}
		cancel()
	}()
	err := <-done
	em.Emit(Event{Ev: "exited", Identity: id, Err: fmt.Sprint(err)})
	return err
}

type renewReporter struct {
	leader.NopObserver
	em *Emitter
	id string
}

func (r renewReporter) Renewed(l leader.Leadership, latency time.Duration) {
	r.em.Emit(Event{Ev: "renewed", Identity: r.id, Mono: Mono() - int64(latency)})
}

func (r renewReporter) Elected(l leader.Leadership) {
	r.em.Emit(Event{Ev: "renewed", Identity: r.id}) // the election's own check
}

// Candidate is a running candidate process.
type Candidate struct {
	ID    string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{}
}

// Spawn starts exe with o.Args(); its events go to events (shared by a
// whole fleet; the channel must be drained).
func Spawn(exe string, o Options, events chan<- Event) (*Candidate, error) {
	cmd := exec.Command(exe, o.Args()...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	// A candidate also exits when its stdin closes, which the kernel does
	// when this process ends.
	release, err := proc.Start(cmd, proc.Options{DeathSignal: syscall.SIGKILL})
	if err != nil {
		return nil, err
	}
	c := &Candidate{ID: o.ID, cmd: cmd, stdin: stdin, done: make(chan struct{})}
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var e Event
			if json.Unmarshal(sc.Bytes(), &e) == nil && e.Ev != "" {
				events <- e
			}
		}
	}()
	go func() {
		<-readDone
		cmd.Wait()
		release()
		close(c.done)
	}()
	return c, nil
}

// Send writes a command line ("resign", "exit").
func (c *Candidate) Send(line string) error {
	_, err := fmt.Fprintln(c.stdin, line)
	return err
}

// Signal sends sig to the process.
func (c *Candidate) Signal(sig syscall.Signal) error { return proc.Signal(c.cmd.Process, sig) }

// Pause stops the process (SIGSTOP; unsupported on Windows).
func (c *Candidate) Pause() error { return proc.Stop(c.cmd.Process) }

// Resume continues a paused process.
func (c *Candidate) Resume() error { return proc.Cont(c.cmd.Process) }

// Done is closed when the process has exited and its output was read.
func (c *Candidate) Done() <-chan struct{} { return c.done }

// Stop asks the candidate to exit, and kills it after grace.
func (c *Candidate) Stop(grace time.Duration) {
	c.Resume()
	c.Send("exit")
	c.stdin.Close()
	select {
	case <-c.done:
	case <-time.After(grace):
		c.Signal(syscall.SIGKILL)
		<-c.done
	}
}

// Fleet is a set of candidates sharing one event stream.
type Fleet struct {
	Exe    string
	Events chan Event
	mu     sync.Mutex
	byID   map[string]*Candidate
}

// New returns an empty fleet that spawns exe.
func New(exe string) *Fleet {
	return &Fleet{Exe: exe, Events: make(chan Event, 65536), byID: map[string]*Candidate{}}
}

// Add spawns a candidate.
func (f *Fleet) Add(o Options) (*Candidate, error) {
	c, err := Spawn(f.Exe, o, f.Events)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.byID[o.ID] = c
	f.mu.Unlock()
	return c, nil
}

// Get returns a candidate by id.
func (f *Fleet) Get(id string) *Candidate {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.byID[id]
}

// Remove forgets a candidate (after it was killed).
func (f *Fleet) Remove(id string) {
	f.mu.Lock()
	delete(f.byID, id)
	f.mu.Unlock()
}

// StopAll stops every candidate.
func (f *Fleet) StopAll() {
	f.mu.Lock()
	cs := make([]*Candidate, 0, len(f.byID))
	for _, c := range f.byID {
		cs = append(cs, c)
	}
	f.byID = map[string]*Candidate{}
	f.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Add(1)
		go func() { defer wg.Done(); c.Stop(10 * time.Second) }()
	}
	wg.Wait()
}

// ErrTimeout is returned by Next when no matching event came in time.
var ErrTimeout = errors.New("fleet: timed out waiting for an event")

// Next returns the next event named ev (from any candidate but those in
// skip), dropping others, within timeout.
func (f *Fleet) Next(ev string, timeout time.Duration, skip ...string) (Event, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case e := <-f.Events:
			if e.Ev != ev {
				continue
			}
			skipped := false
			for _, s := range skip {
				skipped = skipped || e.Identity == s
			}
			if !skipped {
				return e, nil
			}
		case <-t.C:
			return Event{}, fmt.Errorf("%w: %q", ErrTimeout, ev)
		}
	}
}

// runBare is a candidate without an elector (Options.Bare): a session that
// waits in pg_advisory_lock with no timeout and no checks, the fastest a
// lock can change hands.
func runBare(ctx context.Context, o Options, in io.Reader, em *Emitter) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	conn, err := pgx.Connect(ctx, o.DSN)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	args, vals := leader.KeyFromName(o.Key).SQLArgs(1)
	resign := make(chan struct{}, 1)
	go func() {
		sc := bufio.NewScanner(in)
		for sc.Scan() {
			switch sc.Text() {
			case "resign":
				select {
				case resign <- struct{}{}:
				default:
				}
			case "exit":
				cancel()
				return
			}
		}
		cancel()
	}()
	em.Emit(Event{Ev: "started", Identity: o.ID, Data: strconv.Itoa(os.Getpid())})
	for term := int64(1); ; term++ {
		if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock("+args+")", vals...); err != nil {
			em.Emit(Event{Ev: "exited", Identity: o.ID, Err: fmt.Sprint(ctx.Err())})
			return nil
		}
		em.Emit(Event{Ev: "elected", Identity: o.ID, Term: term})
		select {
		case <-ctx.Done():
			return nil
		case <-resign:
		}
		if _, err := conn.Exec(ctx, "SELECT pg_advisory_unlock("+args+")", vals...); err != nil {
			return err
		}
		em.Emit(Event{Ev: "demoted", Identity: o.ID, Term: term, Err: "resigned"})
	}
}
