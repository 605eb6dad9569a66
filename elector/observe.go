package elector

import (
	"context"
	"errors"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/internal/lockconn"
	"github.com/pgleader/pgleader/internal/timing"
	"github.com/pgleader/pgleader/leader"
)

// observePoll is how often Observe looks the holder up when no
// announcement came: the one change nobody announces is a leader whose
// session ended with no successor.
var observePoll = 5 * time.Second

// Observe watches who leads key without campaigning (etcd's Observe,
// River's Listen): it calls fn with the leader's identity now and at every
// change, and with "" while nobody holds the key, until ctx ends; then it
// returns ctx's error. It runs on one connection of its own: it listens on
// the key's channel, where every new leader announces itself as it starts
// leading and a leader that steps down with no successor announces the
// vacancy, and looks the holder up in pg_locks at connect, after each
// announcement, and every 5 seconds. What fn gets is always what pg_locks
// showed, never an announcement's payload (NOTIFY is not authenticated:
// any role could announce any name): an announcement from a session other
// than the holder's triggers a lookup, at most one per 250 ms, and a
// vacancy from the holder's own session a lookup at once. It reconnects
// after an error, with backoff. fn runs on Observe's goroutine; keep it
// short.
func Observe(ctx context.Context, connect Connector, key leader.Key, fn func(identity string)) error {
	if connect == nil || fn == nil {
		return &ConfigError{Field: "Observe", Rule: "needs a Connector and a callback"}
	}
	channel := lockconn.NewTarget(key, "", "", "").Channel()
	last, reported := "", false
	report := func(id string) {
		if !reported || id != last {
			last, reported = id, true
			fn(id)
		}
	}
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval, bo.MaxElapsedTime = 50*time.Millisecond, 2*time.Second, 0
	for {
		err := observeOnce(ctx, connect, key, channel, report)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		_ = err // a lost connection: the next one tells
		if !timing.Sleep(ctx, bo.NextBackOff()) {
			return ctx.Err()
		}
	}
}

// observeOnce observes on one connection until it fails or ctx ends.
func observeOnce(ctx context.Context, connect Connector, key leader.Key, channel string, report func(string)) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	conn, err := connect.Connect(cctx)
	cancel()
	if err != nil {
		return err
	}
	defer lockconn.Close(conn)
	var holderPID uint32
	var lastLookup time.Time
	lookup := func() error {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		h, err := leader.Holder(qctx, conn, key)
		if err == nil {
			holderPID, lastLookup = h.Holder.PID, time.Now()
			report(h.Identity())
		}
		return err
	}
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	if _, err = lockconn.Pin(qctx, conn); err == nil {
		_, err = conn.Exec(qctx, "LISTEN "+pgx.Identifier{channel}.Sanitize())
	}
	cancel()
	if err != nil {
		return err
	}
	if err := lookup(); err != nil {
		return err
	}
	due := time.Time{} // a lookup a notification asked for; zero: none
	for {
		next := lastLookup.Add(observePoll)
		if !due.IsZero() && due.Before(next) {
			next = due
		}
		if !time.Now().Before(next) {
			due = time.Time{}
			if err := lookup(); err != nil {
				return err
			}
			continue
		}
		wctx, cancel := context.WithDeadline(ctx, next)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err == nil && n.Channel == channel:
			switch {
			case n.Payload == "" && holderPID != 0 && n.PID == holderPID:
				due = time.Now() // the holder stepped down with no successor: look now
			case n.PID != holderPID && due.IsZero():
				due = lastLookup.Add(lockconn.VerifyEvery) // another session speaks: look, rate-limited
			}
		case err == nil, errors.Is(err, context.DeadlineExceeded):
		default:
			return err
		}
	}
}
