package elector_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/leader"
)

// semWatch counts who is inside OnElected, across every candidate of a
// semaphore, and records what must never happen.
type semWatch struct {
	t      *testing.T
	mu     sync.Mutex
	inside map[string]int    // candidate -> OnElected calls running
	slotOf map[string]int    // candidate -> the slot its running call leads
	pidOf  map[string]uint32 // candidate -> the backend of its last tenure
	// faulted: candidates whose backend the test terminated. The server
	// frees the lock at once and the candidate learns it from its socket
	// a moment later, so its OnElected may still run when the slot's next
	// leader begins: the overlap only fencing orders, allowed for them
	// alone, until their OnElected returns.
	faulted map[string]bool
	total   int
	most    int
	pairs   map[string][2]int // candidate -> OnElected, OnDemoted calls
	bad     []string
}

func newSemWatch(t *testing.T) *semWatch {
	w := &semWatch{t: t, inside: map[string]int{}, slotOf: map[string]int{}, pidOf: map[string]uint32{}, faulted: map[string]bool{}, pairs: map[string][2]int{}}
	t.Cleanup(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, b := range w.bad {
			t.Error(b)
		}
		for id, p := range w.pairs {
			if p[0] != p[1] {
				t.Errorf("%s: %d OnElected, %d OnDemoted", id, p[0], p[1])
			}
		}
	})
	return w
}

func (w *semWatch) callbacks(id string, s **elector.Semaphore, slots int) elector.Callbacks {
	return elector.Callbacks{
		OnElected: func(ctx context.Context, l leader.Leadership) {
			slot, ok := (*s).Slot()
			w.mu.Lock()
			w.inside[id]++
			w.total++
			w.most = max(w.most, w.total)
			p := w.pairs[id]
			p[0]++
			w.pairs[id] = p
			excused := 0
			for other, n := range w.inside {
				if n > 0 && w.faulted[other] {
					excused++
				}
			}
			switch {
			case w.total-excused > slots:
				w.bad = append(w.bad, fmt.Sprintf("%d candidates inside OnElected at once (%d of them terminated), with %d slots", w.total, excused, slots))
			case w.inside[id] > 1:
				w.bad = append(w.bad, fmt.Sprintf("%s inside OnElected twice at once", id))
			case !ok || l.Key != leader.SlotKey((*s).Key(), slot):
				w.bad = append(w.bad, fmt.Sprintf("%s: OnElected for %s, but Slot says %d, %v", id, l.Key, slot, ok))
			}
			for other, sl := range w.slotOf {
				if sl == slot && w.inside[other] > 0 && !w.faulted[other] {
					w.bad = append(w.bad, fmt.Sprintf("slot %d led by %s and %s at once", slot, id, other))
				}
			}
			w.slotOf[id] = slot
			w.pidOf[id] = l.BackendPID
			w.mu.Unlock()
			<-ctx.Done()
			w.mu.Lock()
			w.inside[id]--
			w.total--
			delete(w.slotOf, id)
			delete(w.faulted, id)
			w.mu.Unlock()
		},
		OnDemoted: func(l leader.Leadership, reason error) {
			w.mu.Lock()
			p := w.pairs[id]
			p[1]++
			w.pairs[id] = p
			w.mu.Unlock()
		},
	}
}

// leaders returns the candidates inside OnElected, and how many.
func (w *semWatch) leaders() (map[string]int, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]int{}
	for id, n := range w.inside {
		if n > 0 {
			out[id] = w.slotOf[id]
		}
	}
	return out, w.total
}

type semCandidate struct {
	s    *elector.Semaphore
	stop func()
}

func startSem(t *testing.T, w *semWatch, dsn string, key leader.Key, id string, slots int) *semCandidate {
	t.Helper()
	c := &semCandidate{}
	s, err := elector.NewSemaphore(elector.Config{
		Connect: elector.DSN(dsn), Key: key, Identity: id,
		Callbacks:     w.callbacks(id, &c.s, slots),
		RenewInterval: tInterval, RenewDeadline: tDeadline, LeaseDuration: tLease,
		Logger: testLogger(t, nil),
	}, slots)
	if err != nil {
		t.Fatal(err)
	}
	c.s = s
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var once sync.Once
	c.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("%s: Run: %v", id, err)
			}
		})
	}
	t.Cleanup(c.stop)
	return c
}

// With 3 slots and 10 candidates, 3 lead, each a slot of its own, never
// more; after a resign, a terminated backend or a stopped candidate, the
// freed slot is led again.
func TestSemaphoreAdmitsN(t *testing.T) {
	srv := sharedServer(t)
	w := newSemWatch(t)
	key := testKey(t)
	const slots = 3
	cands := map[string]*semCandidate{}
	for i := range 10 {
		id := fmt.Sprintf("sem-%d", i)
		cands[id] = startSem(t, w, srv.DSN(), key, id, slots)
	}
	full := func(what string) map[string]int {
		t.Helper()
		var got map[string]int
		eventually(t, what, func() (bool, string) {
			var n int
			got, n = w.leaders()
			return n == slots, fmt.Sprint(got)
		})
		return got
	}
	leaders := full("3 candidates lead")
	for round := range 6 {
		var victim string
		for id := range leaders {
			victim = id
			break
		}
		began := time.Now()
		switch round % 3 {
		case 0:
			if err := cands[victim].s.Resign(context.Background()); err != nil {
				t.Fatal(err)
			}
		case 1:
			w.mu.Lock()
			pid := w.pidOf[victim]
			w.faulted[victim] = true
			w.mu.Unlock()
			if pid == 0 {
				t.Fatalf("%s leads with no backend pid in its status", victim)
			}
			if err := srv.Exec(context.Background(), fmt.Sprintf("SELECT pg_terminate_backend(%d)", pid)); err != nil {
				t.Fatal(err)
			}
		case 2:
			cands[victim].stop()
			delete(cands, victim)
			id := fmt.Sprintf("sem-new-%d", round)
			cands[id] = startSem(t, w, srv.DSN(), key, id, slots)
		}
		// The victim's slot empties, then 3 lead again.
		eventually(t, "the victim's tenure ends", func() (bool, string) {
			l, _ := w.leaders()
			_, in := l[victim]
			return !in, fmt.Sprint(l)
		})
		leaders = full(fmt.Sprintf("round %d: 3 candidates lead again", round))
		t.Logf("round %d: %s's slot refilled; 3 lead again %s after the fault", round, victim, time.Since(began).Round(time.Millisecond))
	}
	w.mu.Lock()
	most := w.most
	w.mu.Unlock()
	if most < slots {
		t.Fatalf("at most %d inside at once, want %d", most, slots)
	}
}

// A candidate alone leads one slot, not all of them: once it leads, its
// other slots' campaigns stop and their sessions close.
func TestSemaphoreOneSlotPerCandidate(t *testing.T) {
	srv := sharedServer(t)
	w := newSemWatch(t)
	key := testKey(t)
	c := startSem(t, w, srv.DSN(), key, "sem-alone", 4)
	select {
	case <-c.s.Elected():
	case <-time.After(waitLong):
		t.Fatal("not elected")
	}
	eventually(t, "one session left", func() (bool, string) {
		n := sessions(t, srv, "sem-alone")
		return n == 1, fmt.Sprint(n, " sessions")
	})
	if slot, ok := c.s.Slot(); !ok || slot < 0 || slot > 3 {
		t.Fatalf("Slot() = %d, %v", slot, ok)
	}
	eventually(t, "IsLeader and Leader", func() (bool, string) {
		return c.s.IsLeader() && c.s.Leader() == "sem-alone", c.s.Leader()
	})
	// A resign frees the slot; the candidate leads one again (the same
	// or another: it is alone).
	if err := c.s.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "leads again", func() (bool, string) {
		l, n := w.leaders()
		return n == 1, fmt.Sprint(l)
	})
	c.stop()
	if err := c.s.Resign(context.Background()); !errors.Is(err, leader.ErrNotLeader) {
		t.Fatalf("Resign after Run returned: %v, want ErrNotLeader", err)
	}
}

func TestSemaphoreConfig(t *testing.T) {
	ok := elector.Config{Connect: elector.DSN("postgres://u@127.0.0.1:1/db"), Key: testKey(t),
		Callbacks: elector.Callbacks{OnElected: func(context.Context, leader.Leadership) {}}}
	for _, c := range []struct {
		name  string
		cfg   func(elector.Config) elector.Config
		slots int
		field string
	}{
		{"no slots", nil, 0, "slots"},
		{"too many slots", nil, elector.MaxSemaphoreSlots + 1, "slots"},
		{"OnNewLeader", func(c elector.Config) elector.Config { c.Callbacks.OnNewLeader = func(string) {}; return c }, 3, "Callbacks.OnNewLeader"},
		{"no OnElected", func(c elector.Config) elector.Config { c.Callbacks.OnElected = nil; return c }, 3, "Callbacks.OnElected"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := ok
			if c.cfg != nil {
				cfg = c.cfg(cfg)
			}
			_, err := elector.NewSemaphore(cfg, c.slots)
			var ce *elector.ConfigError
			if !errors.Is(err, elector.ErrInvalidConfig) || !errors.As(err, &ce) || ce.Field != c.field {
				t.Fatalf("err %v, want a ConfigError for %s", err, c.field)
			}
		})
	}
	s, err := elector.NewSemaphore(ok, 1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Run(ctx); err != nil {
		t.Fatalf("Run with a done context: %v", err)
	}
	if err := s.Run(ctx); !errors.Is(err, elector.ErrAlreadyRunning) {
		t.Fatalf("second Run: %v, want ErrAlreadyRunning", err)
	}
}

// Two slots granted to one candidate at nearly the same moment: only the
// first runs the user's OnElected; the second's tenure ends without a
// callback; the slot is free again only after the user's OnDemoted, so the
// user's callbacks stay in pairs and one at a time.
func TestSemaphoreSecondSlotNeverRuns(t *testing.T) {
	var mu sync.Mutex
	var elected, demoted []string
	entered := make(chan struct{}, 4)
	var s *elector.Semaphore
	freedTooSoon := false
	s, err := elector.NewSemaphore(elector.Config{Connect: elector.DSN("postgres://u@127.0.0.1:1/db"), Key: testKey(t),
		Callbacks: elector.Callbacks{
			OnElected: func(ctx context.Context, l leader.Leadership) {
				mu.Lock()
				elected = append(elected, l.Key.String())
				mu.Unlock()
				entered <- struct{}{}
				<-ctx.Done()
			},
			OnDemoted: func(l leader.Leadership, reason error) {
				if _, ok := s.Slot(); !ok {
					freedTooSoon = true
				}
				mu.Lock()
				demoted = append(demoted, l.Key.String())
				mu.Unlock()
			},
		}}, 3)
	if err != nil {
		t.Fatal(err)
	}
	l := func(i int) leader.Leadership {
		return leader.Leadership{Key: leader.SlotKey(s.Key(), i), Identity: s.Identity()}
	}
	cb0, cb1 := elector.SemaphoreCallbacks(s, 0), elector.SemaphoreCallbacks(s, 1)
	ctx0, cancel0 := context.WithCancel(context.Background())
	ret0 := make(chan struct{})
	go func() { defer close(ret0); cb0.OnElected(ctx0, l(0)) }()
	<-entered
	if slot, ok := s.Slot(); slot != 0 || !ok {
		t.Fatalf("Slot() = %d, %v after slot 0's OnElected; want 0, true", slot, ok)
	}
	// Slot 1 granted while slot 0 is led: its OnElected returns at once.
	ret1 := make(chan struct{})
	ctx1, cancel1 := context.WithCancel(context.Background())
	defer cancel1()
	go func() { defer close(ret1); cb1.OnElected(ctx1, l(1)) }()
	select {
	case <-ret1:
	case <-time.After(waitLong):
		t.Fatal("slot 1's OnElected ran while slot 0 was led")
	}
	cb1.OnDemoted(l(1), leader.ErrCallbackReturned)
	if slot, _ := s.Slot(); slot != 0 {
		t.Fatalf("slot 1's short tenure changed Slot() to %d", slot)
	}
	cancel0()
	<-ret0
	cb0.OnDemoted(l(0), leader.ErrResigned)
	if freedTooSoon {
		t.Fatal("the slot was free before the user's OnDemoted ran: another slot's OnElected could start before it")
	}
	if _, ok := s.Slot(); ok {
		t.Fatal("a slot still held after its OnDemoted")
	}
	// Now slot 1 may run.
	go func() { cb1.OnElected(ctx1, l(1)) }()
	<-entered
	if slot, ok := s.Slot(); slot != 1 || !ok {
		t.Fatalf("Slot() = %d, %v; want 1, true", slot, ok)
	}
	cancel1()
	cb1.OnDemoted(l(1), leader.ErrResigned)
	mu.Lock()
	defer mu.Unlock()
	if len(elected) != 2 || len(demoted) != 2 {
		t.Fatalf("user callbacks: OnElected %v, OnDemoted %v; want one pair for slot 0, then one for slot 1", elected, demoted)
	}
}
