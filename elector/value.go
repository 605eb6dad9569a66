package elector

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/internal/wire/terms"
	"github.com/pgleader/pgleader/leader"
)

// valueLease writes and reads leaders' values (see Config.Value).
type valueLease interface {
	Proclaim(ctx context.Context, t *lockconn.Target, proclaimSQL, keyName string, value []byte) error
	ReadValue(ctx context.Context, sql, trustedOwner string) (lockconn.Value, error)
}

// proclaim is a Proclaim call waiting for the leader's goroutine.
type proclaim struct {
	value []byte
	done  chan error // buffered: the answer never blocks the leader
}

// Proclaim changes this leader's value (see Config.Value) without a new
// election (etcd's Proclaim): the elector's goroutine writes it between
// renews, in a round trip that also proves it still holds the lock, and
// announces it, so that followers and observers read it at once. It
// returns once the value is written; leader.ErrNotLeader when this elector
// does not lead (or stops leading before the write); a *ConfigError when
// values are off or the value is too large; the server's error when it
// refused the write (the elector keeps leading, and keeps the value it had);
// or ctx's error (the value may still be written). The value also becomes
// the one this elector proclaims at its later elections.
func (e *Elector) Proclaim(ctx context.Context, value []byte) error {
	switch {
	case !e.cfg.Values.Enabled:
		return &ConfigError{Field: "Values", Rule: "Proclaim needs values on (Config.Value or Values.Enabled)"}
	case len(value) > leader.MaxValueSize:
		return &ConfigError{Field: "Proclaim", Rule: fmt.Sprintf("the value must be at most %d bytes, got %d", leader.MaxValueSize, len(value))}
	}
	value = append([]byte{}, value...) // the caller's slice stays theirs; never nil
	p := proclaim{value: value, done: make(chan error, 1)}
	e.mu.Lock()
	t := e.tenure
	if t == nil || t.ended || !e.IsLeader() {
		e.mu.Unlock()
		return leader.ErrNotLeader
	}
	t.proclaims = append(t.proclaims, p)
	t.wakeUp()
	e.mu.Unlock()
	select {
	case err := <-p.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// LeaderValue returns the leader and its value as this elector last learned
// them (see Callbacks.OnLeaderValue): its own while it leads. Value is nil
// until the leader has written one, and with values off.
func (e *Elector) LeaderValue() leader.Proclamation {
	if p := e.leaderValue.Load(); p != nil && p.Identity == e.Leader() {
		return *p
	}
	return leader.Proclamation{Identity: e.Leader()}
}

// setLeaderValue stores what a read paired, and reports a change.
func (e *Elector) setLeaderValue(p leader.Proclamation) {
	if old := e.leaderValue.Load(); old != nil && old.Identity == p.Identity && string(old.Value) == string(p.Value) && (old.Value == nil) == (p.Value == nil) {
		return
	}
	e.leaderValue.Store(&p)
	if e.cfg.Callbacks.OnLeaderValue != nil {
		e.pendingValue.Store(&p)
		select {
		case e.newValue <- struct{}{}:
		default: // a report is pending; it will carry the latest
		}
	}
}

// reportValues calls OnLeaderValue off the elector's goroutine, in order
// and coalesced (see reportLeaders).
func (e *Elector) reportValues(stop <-chan struct{}) {
	var last *leader.Proclamation
	for {
		select {
		case <-stop:
			return
		case <-e.newValue:
			if p := e.pendingValue.Load(); p != last {
				last = p
				e.cfg.Callbacks.OnLeaderValue(*p)
			}
		}
	}
}

// ensureValues makes sure, with values on, that the values table exists
// and is trusted, and builds its statements.
func (e *Elector) ensureValues(ctx context.Context, ls *lockconn.Lease) error {
	v := e.cfg.Values
	if !v.Enabled {
		return nil
	}
	o := terms.EnsureOptions{Create: !v.NoCreate, Schemas: ls.Schemas(), TrustedOwner: v.TrustedOwner}
	tbl, err := terms.EnsureValues(ctx, ls.Conn(), v.Table, o)
	if err != nil {
		return fmt.Errorf("values: %w", err)
	}
	e.proclaimSQL = terms.ProclaimSQL(tbl.Quoted())
	e.valueSQL = lockconn.TagOf(e.cfg.Key).ValueSQL(tbl.Quoted())
	return nil
}

// publish writes this leader's value, once it has announced itself. The
// server refusing the write (a privilege, a lock wait) does not end the
// tenure: it is logged, and tried again at the next renew.
func (e *Elector) publish(t *tenure, ls lease) error {
	v := e.value.Load()
	if !e.cfg.Values.Enabled || v == nil {
		t.unpublished = false
		return nil
	}
	err := e.writeValue(t, ls, *v)
	var ve *lockconn.ValueError
	if errors.As(err, &ve) {
		if !t.unpublished {
			t.log.Warn("could not write this leader's value; trying again at every renew", zap.Error(err))
		}
		t.unpublished = true
		return nil
	}
	t.unpublished = false
	return err
}

// writeValue proclaims value within the trust window, and takes it as the
// leader's value. A window that closes first ends the tenure as a renew's
// does (renewContext: the session outlives it until OnElected returned).
func (e *Elector) writeValue(t *tenure, ls lease, value []byte) error {
	rctx, lapsed, cancel := e.renewContext(t)
	err := ls.Proclaim(rctx, e.target, e.proclaimSQL, e.cfg.Key.String(), value)
	cancel()
	switch {
	case err != nil && lapsed():
		return fmt.Errorf("%w (%v)", errLapsed, err)
	case err == nil && lapsed():
		return errAnsweredLate
	}
	if err == nil {
		e.setLeaderValue(leader.Proclamation{Identity: e.cfg.Identity, Value: value})
	}
	return err
}

// proclaimed writes the value the latest Proclaim asked for, and answers
// every waiting call. It returns a fault that ends the tenure.
func (e *Elector) proclaimed(t *tenure, ls lease) error {
	e.mu.Lock()
	ps := t.proclaims
	t.proclaims = nil
	t.wake, t.wakeUp = context.WithCancel(t.stop)
	e.mu.Unlock()
	if len(ps) == 0 {
		return nil
	}
	value := ps[len(ps)-1].value
	err := e.writeValue(t, ls, value)
	var ve *lockconn.ValueError
	switch {
	case err == nil:
		e.value.Store(&value)
		t.unpublished = false
	case errors.As(err, &ve):
	default:
		// The lock or the connection is in doubt: the tenure ends.
		for _, p := range ps {
			p.done <- fmt.Errorf("%w: %w", leader.ErrNotLeader, err)
		}
		return err
	}
	for _, p := range ps {
		p.done <- err
	}
	return nil
}

// endProclaims answers the Proclaim calls a tenure that ends leaves
// waiting, and takes no more.
func (e *Elector) endProclaims(t *tenure) {
	e.mu.Lock()
	defer e.mu.Unlock()
	t.ended = true
	for _, p := range t.proclaims {
		p.done <- leader.ErrNotLeader
	}
	t.proclaims = nil
	t.wakeUp()
}

// followValue reads the leader's value after a campaign round, with values
// on: when the round saw (or an earlier one learned) a leader whose value
// it has not read, when the leader announced itself again (a new value),
// and on every plain round (no notifications reach it). A read the server
// refuses is logged; a lost connection ends the session.
func (e *Elector) followValue(ls lease, r lockconn.Round) error {
	id := e.Leader()
	switch {
	case !e.cfg.Values.Enabled:
		return nil
	case r.Free:
		e.valuePID = 0
		return nil
	case id == "" || id == e.cfg.Identity:
		return nil
	case e.leaderPID != 0 && e.leaderPID == e.valuePID && !r.Refresh && e.roundWait.Load() != 0:
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.RenewDeadline)
	defer cancel()
	v, err := ls.ReadValue(ctx, e.valueSQL, e.cfg.Values.TrustedOwner)
	switch {
	case err != nil && (ctx.Err() != nil || !lockconn.IsServerError(err)):
		return fmt.Errorf("%w: reading the leader's value: %w", leader.ErrConnectionLost, err)
	case err != nil:
		e.log.Warn("could not read the leader's value", zap.Error(err))
		e.valuePID = e.leaderPID // not again until the leader changes or proclaims
		return nil
	case v.Free || v.Holder == "":
		return nil // the next round tells who leads
	}
	// The read proved who holds the lock, and its backend.
	e.setLeader(v.Holder)
	e.leaderPID, e.valuePID = v.PID, v.PID
	e.setLeaderValue(leader.Proclamation{Identity: identity(v.Holder), Value: v.Value})
	return nil
}
