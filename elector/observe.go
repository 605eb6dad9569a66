package elector

import (
	"context"
	"errors"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/internal/wire/terms"
	"github.com/pgleader/pgleader/internal/wire/timing"
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
	return observe(ctx, connect, key, nil, func(p leader.Proclamation) { fn(p.Identity) })
}

// ObserveValues is Observe with each leader's value (see Config.Value),
// read from the values table v names (v.Enabled is implied; NoCreate too:
// it creates nothing). fn gets the leader and its value now and whenever
// either changes: a new leader first with a nil Value (until it has
// written its own, right after it announced itself), then with its value,
// and again at each Proclaim, which announces the new value on the key's
// channel. Identity and Value come from one read that pairs the table's row
// with the holder in pg_locks on the holder's backend pid, session start
// and identity: an earlier leader's value is never reported with a later
// leader's identity. While the table does not exist yet the Value is nil.
// A table owned by a role this one is not a member of (nor
// v.TrustedOwner) is refused: ObserveValues returns leader.ErrForeignTable
// at once; otherwise it returns ctx's error when ctx ends.
func ObserveValues(ctx context.Context, connect Connector, key leader.Key, v Values, fn func(leader.Proclamation)) error {
	if connect == nil || fn == nil {
		return &ConfigError{Field: "ObserveValues", Rule: "needs a Connector and a callback"}
	}
	if v.Table == "" {
		v.Table = leader.DefaultValuesTable
	}
	if _, err := terms.Quote(v.Table); err != nil {
		return &ConfigError{Field: "Values.Table", Rule: err.Error()}
	}
	return observe(ctx, connect, key, &v, fn)
}

// observe is Observe, with values when v is set.
func observe(ctx context.Context, connect Connector, key leader.Key, v *Values, fn func(leader.Proclamation)) error {
	channel := lockconn.NewTarget(key, "", "", "").Channel()
	var last leader.Proclamation
	reported := false
	report := func(p leader.Proclamation) {
		if !reported || p.Identity != last.Identity || string(p.Value) != string(last.Value) || (p.Value == nil) != (last.Value == nil) {
			last, reported = p, true
			fn(p)
		}
	}
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval, bo.MaxElapsedTime = 50*time.Millisecond, 2*time.Second, 0
	for {
		err := observeOnce(ctx, connect, key, channel, v, report)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, terms.ErrForeignTable) {
			return err
		}
		// A lost connection: the next one tells.
		if !timing.Sleep(ctx, bo.NextBackOff()) {
			return ctx.Err()
		}
	}
}

// observeOnce observes on one connection until it fails or ctx ends.
func observeOnce(ctx context.Context, connect Connector, key leader.Key, channel string, v *Values, report func(leader.Proclamation)) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	conn, err := connect.Connect(cctx)
	cancel()
	if err != nil {
		return err
	}
	defer lockconn.Close(conn)
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	var schemas []string
	if schemas, err = lockconn.Pin(qctx, conn); err == nil {
		_, err = conn.Exec(qctx, "LISTEN "+pgx.Identifier{channel}.Sanitize())
	}
	cancel()
	if err != nil {
		return err
	}
	o := &observer{conn: conn, key: key, channel: channel, report: report, values: v, schemas: schemas}
	if err := o.lookup(ctx); err != nil {
		return err
	}
	for {
		if err := o.step(ctx); err != nil {
			return err
		}
	}
}

// observer is Observe on one connection: what the server proved of the
// holder, and a lookup a notification made due.
type observer struct {
	conn      *pgx.Conn
	key       leader.Key
	channel   string
	report    func(leader.Proclamation)
	holderPID uint32
	// values: the values table to read (nil: none), found in schemas
	// (the role's own search_path); valueSQL once it was found.
	values     *Values
	schemas    []string
	valueSQL   string
	lastLookup time.Time
	due        time.Time // a lookup a notification asked for; zero: none
}

// lookup reads the holder from pg_locks and reports it.
func (o *observer) lookup(ctx context.Context) error {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if o.values != nil && o.valueSQL == "" {
		t, found, err := terms.Find(qctx, o.conn, o.values.Table, terms.EnsureOptions{Schemas: o.schemas, TrustedOwner: o.values.TrustedOwner})
		switch {
		case err != nil:
			return err
		case found:
			o.valueSQL = lockconn.TagOf(o.key).ValueSQL(t.Quoted())
		}
	}
	if o.valueSQL != "" {
		v, err := lockconn.ReadValue(qctx, o.conn, o.valueSQL, o.values.TrustedOwner)
		if err == nil {
			o.holderPID, o.lastLookup = uint32(v.PID), time.Now()
			o.report(leader.Proclamation{Identity: identity(v.Holder), Value: v.Value})
		}
		return err
	}
	h, err := leader.Holder(qctx, o.conn, o.key)
	if err == nil {
		o.holderPID, o.lastLookup = h.Holder.PID, time.Now()
		o.report(leader.Proclamation{Identity: h.Identity()})
	}
	return err
}

// step looks the holder up when a lookup is due (the periodic one, or one
// a notification asked for), or waits for a notification until then.
func (o *observer) step(ctx context.Context) error {
	next := o.lastLookup.Add(observePoll)
	if !o.due.IsZero() && o.due.Before(next) {
		next = o.due
	}
	if !time.Now().Before(next) {
		o.due = time.Time{}
		return o.lookup(ctx)
	}
	wctx, cancel := context.WithDeadline(ctx, next)
	n, err := o.conn.WaitForNotification(wctx)
	cancel()
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case err == nil && n.Channel == o.channel:
		switch {
		case n.Payload == "" && o.holderPID != 0 && n.PID == o.holderPID:
			o.due = time.Now() // the holder stepped down with no successor: look now
		case o.values != nil && o.holderPID != 0 && n.PID == o.holderPID:
			o.due = time.Now() // the holder announced itself again: a new value
		case n.PID != o.holderPID && o.due.IsZero():
			o.due = o.lastLookup.Add(lockconn.VerifyEvery) // another session speaks: look, rate-limited
		}
	case err == nil, errors.Is(err, context.DeadlineExceeded):
	default:
		return err
	}
	return nil
}
