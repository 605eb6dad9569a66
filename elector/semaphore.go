package elector

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/pgleader/pgleader/leader"
)

// MaxSemaphoreSlots bounds NewSemaphore's slots: a candidate that holds no
// slot campaigns on every one of them, with a connection each.
const MaxSemaphoreSlots = 64

// Semaphore is an election with n winners: at most n candidates with the
// same key and n lead at once, on any number of processes, each holding
// one slot. Slot i is the lock of leader.SlotKey(key, i) (slot 0 is key itself,
// the lock of a plain Elector on key), and each slot is an election with
// the whole Elector contract: OnElected and OnDemoted in pairs, a fencing
// term per slot, the trust window, quiet followers, graceful hand-over.
//
// A candidate that holds no slot runs one Elector per slot, each on its
// own connection, so that any freed slot is granted to it at the lock
// manager's speed. Once it holds a slot it stops the others (their
// connections close), and starts them again when its tenure ends: a
// candidate never holds two slots. Two slots granted to it at nearly the
// same moment cannot both run: the second's tenure ends before its
// OnElected is called (the Elector sees a callback that returned at once,
// and its Observer and Logger report that short tenure, with a term of
// its own when fencing is on).
type Semaphore struct {
	cfg   Config // the slots' Config, defaults set, Key the semaphore's
	slots int
	user  Callbacks

	mu     sync.Mutex
	held   int           // the slot this candidate leads, -1 for none
	inside []bool        // per slot: the user's OnElected was called
	els    []*Elector    // per slot: its current Elector, nil between runs
	change chan struct{} // closed and replaced when held changes

	elected     chan struct{}
	electedOnce sync.Once
	ran         atomic.Bool
}

var _ Candidate = (*Semaphore)(nil)

// NewSemaphore returns a Semaphore of slots slots (1 to MaxSemaphoreSlots)
// on cfg.Key, which every candidate must give with the same slots: the
// slots are separate locks, so candidates passing 3 and 5 share slots 0
// to 2 and together admit 5. cfg is checked as New checks it; its
// Callbacks.OnElected gets the slot's Leadership (l.Key is the slot's key;
// Slot says its number). OnNewLeader must be nil: a semaphore has a
// leader per slot (leader.Holder reads the holder of one slot's key).
func NewSemaphore(cfg Config, slots int) (*Semaphore, error) {
	if slots < 1 || slots > MaxSemaphoreSlots {
		return nil, &ConfigError{Field: "slots", Rule: fmt.Sprintf("must be between 1 and %d, got %d", MaxSemaphoreSlots, slots)}
	}
	if cfg.Callbacks.OnNewLeader != nil {
		return nil, &ConfigError{Field: "Callbacks.OnNewLeader", Rule: "must be nil for a Semaphore: it has a leader per slot"}
	}
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Semaphore{cfg: cfg, slots: slots, user: cfg.Callbacks, held: -1,
		inside: make([]bool, slots), els: make([]*Elector, slots),
		change: make(chan struct{}), elected: make(chan struct{})}
	return s, nil
}

// Identity returns the candidate's identity (its application_name on every
// slot's connection).
func (s *Semaphore) Identity() string { return s.cfg.Identity }

// Key returns the semaphore's key (slot 0's).
func (s *Semaphore) Key() leader.Key { return s.cfg.Key }

// Slots returns the number of slots.
func (s *Semaphore) Slots() int { return s.slots }

// Slot returns the slot this candidate leads, and whether it leads one. In
// OnElected it is already the slot of that call.
func (s *Semaphore) Slot() (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held, s.held >= 0
}

// IsLeader reports whether this candidate leads a slot now (within that
// slot's trust window).
func (s *Semaphore) IsLeader() bool {
	if e := s.holder(); e != nil {
		return e.IsLeader()
	}
	return false
}

// Leader returns this candidate's identity while it leads a slot, and ""
// otherwise: a semaphore has a leader per slot, and a candidate that holds
// none does not follow any one of them.
func (s *Semaphore) Leader() string {
	if s.IsLeader() {
		return s.cfg.Identity
	}
	return ""
}

// LeaderValue is this candidate with its own value while it leads a slot
// (a semaphore has no single leader to report otherwise).
func (s *Semaphore) LeaderValue() leader.Proclamation {
	if e := s.holder(); e != nil && s.IsLeader() {
		return e.LeaderValue()
	}
	return leader.Proclamation{}
}

// Status is the status of the slot this candidate leads, or of slot 0's
// campaign when it leads none.
func (s *Semaphore) Status() Status {
	e := s.holder()
	if e == nil {
		s.mu.Lock()
		e = s.els[0]
		s.mu.Unlock()
	}
	if e == nil {
		return Status{Identity: s.cfg.Identity, Key: s.cfg.Key, RenewInterval: s.cfg.RenewInterval,
			RenewDeadline: s.cfg.RenewDeadline, LeaseDuration: s.cfg.LeaseDuration, ReleaseTimeout: s.cfg.ReleaseTimeout}
	}
	return e.Status()
}

// Elected is closed once this candidate first leads a slot.
func (s *Semaphore) Elected() <-chan struct{} { return s.elected }

// Resign hands the slot this candidate leads over gracefully (see
// Elector.Resign); leader.ErrNotLeader when it leads none. The slot's
// campaign starts again one RenewInterval later, and the other slots'
// at once.
func (s *Semaphore) Resign(ctx context.Context) error {
	e := s.holder()
	if e == nil {
		return leader.ErrNotLeader
	}
	return e.Resign(ctx)
}

// holder is the Elector of the slot this candidate leads, or nil.
func (s *Semaphore) holder() *Elector {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held < 0 {
		return nil
	}
	return s.els[s.held]
}

// Run campaigns for a slot, leads it while it holds it, and campaigns for
// every slot again after each demotion, until ctx ends; then it steps down
// gracefully and returns nil once every slot's Elector has returned. It
// returns the first error an Elector's Run returns (the Permanent ones),
// after stopping the others; ErrAlreadyRunning when called a second time.
func (s *Semaphore) Run(ctx context.Context) error {
	if !s.ran.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var first error
	var once sync.Once
	for i := range s.slots {
		wg.Go(func() {
			if err := s.runSlot(ctx, i); err != nil {
				once.Do(func() { first = err })
				cancel()
			}
		})
	}
	wg.Wait()
	return first
}

// runSlot runs slot i's Elector whenever this candidate leads no other
// slot, a new one each time (an Elector runs once).
func (s *Semaphore) runSlot(ctx context.Context, i int) error {
	for {
		if !s.waitFree(ctx, i) {
			return nil
		}
		cfg := s.cfg
		cfg.Key = leader.SlotKey(s.cfg.Key, i)
		cfg.Callbacks = s.callbacks(i)
		e, err := New(cfg)
		if err != nil {
			return err
		}
		sctx, stop := context.WithCancel(ctx)
		watched := make(chan struct{})
		go func() { defer close(watched); s.stopWhenHeldElsewhere(sctx, i, stop) }()
		s.mu.Lock()
		s.els[i] = e
		s.mu.Unlock()
		err = e.Run(sctx)
		stop()
		<-watched
		s.mu.Lock()
		s.els[i] = nil
		s.mu.Unlock()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// waitFree waits until this candidate leads no slot but i; false when ctx
// ended first.
func (s *Semaphore) waitFree(ctx context.Context, i int) bool {
	for {
		s.mu.Lock()
		held, ch := s.held, s.change
		s.mu.Unlock()
		if held < 0 || held == i {
			return true
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

// stopWhenHeldElsewhere calls stop once this candidate leads a slot other
// than i, or returns when ctx ends.
func (s *Semaphore) stopWhenHeldElsewhere(ctx context.Context, i int, stop func()) {
	for {
		s.mu.Lock()
		held, ch := s.held, s.change
		s.mu.Unlock()
		if held >= 0 && held != i {
			stop()
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return
		}
	}
}

// setHeld changes the slot held (s.mu held) and wakes every waiter.
func (s *Semaphore) setHeld(i int) {
	s.held = i
	close(s.change)
	s.change = make(chan struct{})
}

// callbacks wraps the user's callbacks for slot i: OnElected runs only for
// the first slot granted while none is held (a second one returns at
// once, which ends its tenure), and the slot is free again only after the
// user's OnDemoted, so the user's callbacks always come in pairs.
func (s *Semaphore) callbacks(i int) Callbacks {
	return Callbacks{
		OnElected: func(ctx context.Context, l leader.Leadership) {
			s.mu.Lock()
			if s.held >= 0 {
				s.mu.Unlock()
				return // another slot is led: give this one back at once
			}
			s.inside[i] = true
			s.setHeld(i)
			s.mu.Unlock()
			s.electedOnce.Do(func() { close(s.elected) })
			s.user.OnElected(ctx, l)
		},
		OnDemoted: func(l leader.Leadership, reason error) {
			s.mu.Lock()
			inside := s.inside[i]
			s.inside[i] = false
			s.mu.Unlock()
			if !inside {
				return
			}
			if s.user.OnDemoted != nil {
				s.user.OnDemoted(l, reason)
			}
			s.mu.Lock()
			s.setHeld(-1)
			s.mu.Unlock()
		},
	}
}
