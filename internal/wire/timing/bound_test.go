package timing

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ended reports whether ctx ended within d.
func ended(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return true
	case <-time.After(d):
		return false
	}
}

// A statement answered before the window's end: no lapse, and its
// context ends only when the caller ends the bound.
func TestBoundAnsweredInTime(t *testing.T) {
	var lapses atomic.Int32
	ctx, lapsed, end := Bound(time.Now().Add(time.Hour), func() { lapses.Add(1) }, make(chan struct{}), 0)
	if ended(ctx, 20*time.Millisecond) {
		t.Fatal("the context ended before the window did")
	}
	end()
	if lapsed() || lapses.Load() != 0 || ctx.Err() == nil {
		t.Fatalf("lapsed %v, %d lapses, ctx %v", lapsed(), lapses.Load(), ctx.Err())
	}
}

// The window closes first: lapse runs once, at once, but the context
// lives on until the work returned (done), then ends; the answer that
// comes later does not undo the lapse.
func TestBoundLapseWaitsForTheWork(t *testing.T) {
	var lapses atomic.Int32
	done := make(chan struct{})
	lapsedAt := make(chan struct{})
	ctx, lapsed, end := Bound(time.Now().Add(10*time.Millisecond), func() {
		lapses.Add(1)
		close(lapsedAt)
	}, done, 0)
	defer end()
	<-lapsedAt
	if ended(ctx, 50*time.Millisecond) {
		t.Fatal("the context ended while the work still ran: the session would close under it")
	}
	close(done)
	if !ended(ctx, 10*time.Second) {
		t.Fatal("the context outlived the work")
	}
	end()
	if !lapsed() || lapses.Load() != 1 {
		t.Fatalf("lapsed %v, %d lapses; want one", lapsed(), lapses.Load())
	}
}

// A window already closed lapses before Bound returns; limit ends the
// context even if the work never returns.
func TestBoundAlreadyClosedAndLimit(t *testing.T) {
	var lapses atomic.Int32
	ctx, lapsed, end := Bound(time.Now().Add(-time.Millisecond), func() { lapses.Add(1) }, make(chan struct{}), 30*time.Millisecond)
	defer end()
	if lapses.Load() != 1 || !lapsed() {
		t.Fatalf("a closed window: %d lapses before Bound returned, lapsed %v", lapses.Load(), lapsed())
	}
	if !ended(ctx, 10*time.Second) {
		t.Fatal("limit did not end the context")
	}
}

// Answered and lapsed are exclusive: once end ran, the window's end does
// nothing.
func TestBoundEndBeforeTheWindow(t *testing.T) {
	var lapses atomic.Int32
	_, lapsed, end := Bound(time.Now().Add(5*time.Millisecond), func() { lapses.Add(1) }, make(chan struct{}), 0)
	end()
	time.Sleep(20 * time.Millisecond) // past the window: nothing may fire
	if lapsed() || lapses.Load() != 0 {
		t.Fatalf("after end: lapsed %v, %d lapses", lapsed(), lapses.Load())
	}
}
