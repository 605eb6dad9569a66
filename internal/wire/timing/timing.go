// Package timing holds what the Elector and the Group share about time:
// their durations with the defaults and the rules between them, the
// reconnect backoff and what an outage logs, and two small waits.
package timing

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"go.uber.org/zap"

	"github.com/pgleader/pgleader/leader"
)

// The defaults of Durations' fields.
const (
	DefaultRenewInterval     = 1 * time.Second
	DefaultRenewDeadline     = 3 * time.Second
	DefaultLeaseDuration     = 6 * time.Second
	DefaultReleaseTimeout    = 5 * time.Second
	DefaultReconnectMaxDelay = 500 * time.Millisecond
)

// Durations are the timings of an election (an Elector's, or every key's
// of a Group). See the Elector's Config for what each one means.
type Durations struct {
	RenewInterval, RenewDeadline, LeaseDuration, ReleaseTimeout, ReconnectMaxDelay time.Duration
}

// SetDefaults fills the zero fields with the defaults.
func (d *Durations) SetDefaults() {
	def := func(p *time.Duration, v time.Duration) {
		if *p == 0 {
			*p = v
		}
	}
	def(&d.RenewInterval, DefaultRenewInterval)
	def(&d.RenewDeadline, DefaultRenewDeadline)
	def(&d.LeaseDuration, DefaultLeaseDuration)
	def(&d.ReleaseTimeout, DefaultReleaseTimeout)
	def(&d.ReconnectMaxDelay, DefaultReconnectMaxDelay)
}

// Validate checks the rules between the fields (after SetDefaults): a
// *leader.ConfigError naming the first field that breaks one. The order
// RenewInterval < RenewDeadline < LeaseDuration is the safety argument's:
// the leader stops trusting its lock before the server can free it.
func (d Durations) Validate() error {
	bad := func(field, rule string, args ...any) error {
		return &leader.ConfigError{Field: field, Rule: fmt.Sprintf(rule, args...)}
	}
	switch {
	case d.RenewInterval < time.Millisecond:
		return bad("RenewInterval", "must be at least 1ms, got %s", d.RenewInterval)
	case d.RenewDeadline <= d.RenewInterval:
		return bad("RenewDeadline", "must be greater than RenewInterval (%s), got %s", d.RenewInterval, d.RenewDeadline)
	case d.LeaseDuration <= d.RenewDeadline:
		return bad("LeaseDuration", "must be greater than RenewDeadline (%s), got %s", d.RenewDeadline, d.LeaseDuration)
	case d.ReleaseTimeout < 0:
		return bad("ReleaseTimeout", "must not be negative, got %s", d.ReleaseTimeout)
	case d.ReconnectMaxDelay < 0:
		return bad("ReconnectMaxDelay", "must not be negative, got %s", d.ReconnectMaxDelay)
	}
	return nil
}

// Printable checks a name that pgleader shows and sends: 1 to max bytes of
// printable ASCII (no control character, so no terminal escape or forged
// line can hide in it).
func Printable(s string, max int) error {
	if s == "" || len(s) > max {
		return fmt.Errorf("must be 1 to %d bytes, got %d", max, len(s))
	}
	for _, r := range s {
		if r < 0x20 || r > 0x7e {
			return fmt.Errorf("must be printable ASCII, got %q", s)
		}
	}
	return nil
}

// Sleep waits d, or until ctx ends: it reports whether d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// WaitUntil waits for done until deadline: it reports whether done closed.
func WaitUntil(done <-chan struct{}, deadline time.Time) bool {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// Retry is the backoff between sessions: jittered and exponential, from
// 25 ms, capped at ReconnectMaxDelay; reset only by a session that lasted
// LeaseDuration (so a server that accepts and then drops every session
// does not cause a tight loop); and never faster than RenewInterval on a
// standby. It also decides what an outage logs.
type Retry struct {
	bo              *backoff.ExponentialBackOff
	interval, lease time.Duration
	attempt         int
	// What the outage logged: when (zero: nothing yet), its cause, and
	// the attempts since that went unlogged; lastUp is when the last
	// session that connected ended.
	logged, lastUp time.Time
	cause          string
	quiet          int
}

// NewRetry returns the backoff for d.
func NewRetry(d Durations) *Retry {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 25 * time.Millisecond
	bo.MaxInterval = d.ReconnectMaxDelay
	bo.Multiplier = 2
	bo.RandomizationFactor = 0.5
	bo.MaxElapsedTime = 0
	bo.Reset()
	return &Retry{bo: bo, interval: d.RenewInterval, lease: d.LeaseDuration}
}

// Next returns the attempt's number and the delay before it, after a
// session that lasted served and ended with err.
func (r *Retry) Next(served time.Duration, err error) (int, time.Duration) {
	if served > 0 {
		r.lastUp = time.Now()
	}
	if served > r.lease {
		r.attempt = 0
		r.bo.Reset()
		r.logged, r.cause = time.Time{}, ""
	}
	r.attempt++
	delay := r.bo.NextBackOff()
	if errors.Is(err, leader.ErrStandby) {
		delay = max(delay, r.interval)
	}
	return r.attempt, delay
}

// Log says why and when the next session comes, without flooding the log
// in an outage: the first failure with its cause, then one line when the
// cause changes or a minute has passed, with the attempts since and how
// long ago the last session ended. A standby is logged at error level.
func (r *Retry) Log(l *zap.Logger, attempt int, delay time.Duration, err error) {
	cause, now := causeOf(err), time.Now()
	if !r.logged.IsZero() && cause == r.cause && now.Sub(r.logged) < time.Minute {
		r.quiet++
		return
	}
	fields := []zap.Field{zap.Int("attempt", attempt), zap.Duration("delay", delay), zap.Error(err)}
	if r.quiet > 0 {
		fields = append(fields, zap.Int("attempts_unlogged", r.quiet))
	}
	if !r.lastUp.IsZero() {
		fields = append(fields, zap.Duration("since_last_session", now.Sub(r.lastUp).Round(time.Millisecond)))
	}
	msg := "reconnecting"
	if !r.logged.IsZero() {
		msg = "still reconnecting"
	}
	r.logged, r.cause, r.quiet = now, cause, 0
	if errors.Is(err, leader.ErrStandby) {
		l.Error("connected to a standby; "+msg, fields...)
	} else {
		l.Warn(msg, fields...)
	}
}

// causeOf is an error's text without its numbers (ports, pids, times), to
// tell one cause of an outage from another.
func causeOf(err error) string {
	if err == nil {
		return ""
	}
	return strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return -1
		}
		return r
	}, err.Error())
}

// Permanent reports whether a loop gives up on err rather than retrying:
// what no reconnect can fix.
func Permanent(err error) bool {
	for _, p := range []error{leader.ErrTransactionPooling, leader.ErrNoTermsTable, leader.ErrReadOnly, leader.ErrRejected,
		leader.ErrUnsupportedServer, leader.ErrForeignTable} {
		if errors.Is(err, p) {
			return true
		}
	}
	return false
}
