package elector

import (
	"context"
	"errors"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/internal/lockconn"
	"github.com/pgleader/pgleader/leader"
)

// observePoll is how often Observe looks the holder up when no
// announcement came: the one change nobody announces is a leader that
// ended with no successor.
var observePoll = 5 * time.Second

// Observe watches who leads key without campaigning (etcd's Observe,
// River's Listen): it calls fn with the leader's identity now and at every
// change, and with "" while nobody holds the key, until ctx ends; then it
// returns ctx's error. It runs on one connection of its own: it listens on
// the key's channel, where every new leader announces itself as it starts
// leading, and looks the holder up in pg_locks at connect and every 5
// seconds (the one change nobody announces is a leader that ended with no
// successor). It reconnects after an error, with backoff. fn runs on
// Observe's goroutine; keep it short.
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
		t := time.NewTimer(bo.NextBackOff())
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
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
	lookup := func() error {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		h, err := leader.Holder(qctx, conn, key)
		if err == nil {
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
	for {
		wctx, cancel := context.WithTimeout(ctx, observePoll)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err == nil:
			if n.Channel == channel && n.Payload != "" {
				report(n.Payload)
			}
		case errors.Is(err, context.DeadlineExceeded):
			if err := lookup(); err != nil {
				return err
			}
		default:
			return err
		}
	}
}
