package elector

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/leader"
)

// Handover is what a granted resign request led to.
type Handover struct {
	// From is the leader that stepped down, To the one that leads now.
	From, To string
	// Took is from the request to the new leader seen in pg_locks, as the
	// asker measured it (an upper bound: the lock changed hands earlier).
	Took time.Duration
}

// RequestResign asks the current leader of key, wherever it runs, to hand
// over gracefully: its OnElected context is cancelled, it drains, it
// unlocks, and a waiting candidate takes over. With to set, the leader
// reserves the lock for the candidate of that identity, which must stand
// for key (quiet candidates only: a candidate on a session without its
// campaign functions can still win a reserved lock); a ranked candidate's
// application_name, rank and all ("worker-2 [N0 1.8.0]"), names it too.
// RequestResign returns
// once a new leader holds the key, or ctx ends.
//
// The request is a NOTIFY on a channel derived from key; the leader reads
// it between renews with no extra round trip, checks the asker's role
// (see Config.ResignRequests: by default a superuser or a member of the
// leader's own role), and answers on a channel of the asker's backend. The
// errors: leader.ErrNoLeader (nobody holds key), leader.ErrNotCandidate
// (to does not stand for key), leader.ErrRefused (the leader said no, and
// why), leader.ErrNoAnswer (no answer within 5 s: a leader without this
// feature, or a paused one), and ctx's error.
func RequestResign(ctx context.Context, connect Connector, key leader.Key, to string) (Handover, error) {
	if connect == nil || !key.Valid() {
		return Handover{}, &ConfigError{Field: "RequestResign", Rule: "needs a Connector and a valid key"}
	}
	to = identity(to) // the reservation binds to the candidate's identity
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Minute)
		defer cancel()
	}
	conn, err := connect.Connect(ctx)
	if err != nil {
		return Handover{}, fmt.Errorf("connect: %w", err)
	}
	defer lockconn.Close(conn)
	t := lockconn.NewTarget(key, "", "", "")
	from, pid, err := askFor(ctx, conn, t, key, to)
	if err != nil {
		return Handover{From: from}, err
	}
	began := time.Now()
	if err := ask(ctx, conn, t, from, pid, to); err != nil {
		return Handover{From: from}, err
	}
	return waitHandover(ctx, conn, t, from, to, began)
}

// askFor prepares the asker's session (pinned, listening on its reply
// channel) and checks that someone leads key, and that to, when named,
// stands for it. It returns the leader and its backend pid.
func askFor(ctx context.Context, conn *pgx.Conn, t *lockconn.Target, key leader.Key, to string) (string, uint32, error) {
	if _, err := lockconn.Pin(ctx, conn); err != nil {
		return "", 0, err
	}
	reply := lockconn.ReplyChannel(conn.PgConn().PID())
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{reply}.Sanitize()); err != nil {
		return "", 0, err
	}
	from, pid, err := holderOf(ctx, conn, t)
	switch {
	case err != nil:
		return "", 0, err
	case from == "":
		return "", 0, fmt.Errorf("%w: nobody holds %s", leader.ErrNoLeader, key)
	case to != "" && to == from:
		return from, pid, fmt.Errorf("%w: %s already leads %s", leader.ErrRefused, to, key)
	}
	if to != "" {
		ok, err := lockconn.Standing(ctx, conn, t, to)
		if err != nil {
			return from, pid, err
		}
		if !ok {
			return from, pid, fmt.Errorf("%w: %q does not stand for %s", leader.ErrNotCandidate, to, key)
		}
	}
	return from, pid, nil
}

// requestSQL sends a resign request.
const requestSQL = "SELECT pg_catalog.pg_notify($1, $2), pg_catalog.set_config('lock_timeout', '0', true)"

// askAgain is how long an asker waits for an answer before it sends its
// request again: a leader elected a moment ago listens for requests only
// from its first renew on (after OnElected started), so a request it was
// sent before that is never heard.
const askAgain = 250 * time.Millisecond

// ask sends the request, addressed to the leader's backend pid, and reads
// the leader's answer, sending the request again every askAgain until an
// answer comes or answerWait has passed. A leader answers a copy of a
// request it already granted only if it still leads, and a copy that
// reaches the next leader is not addressed to it.
func ask(ctx context.Context, conn *pgx.Conn, t *lockconn.Target, from string, pid uint32, to string) error {
	payload := lockconn.RequestPayload(pid, to)
	actx, cancel := context.WithTimeout(ctx, answerWait)
	defer cancel()
	var n *pgconn.Notification
	var err error
	for {
		// The commit waits for the server-wide notify queue lock: under
		// the caller's lock_timeout, a timeout there would be an ERROR in
		// the server's log with no statement (actx bounds the wait).
		if _, err = conn.Exec(actx, requestSQL, t.ResignChannel(), payload); err != nil {
			break
		}
		wctx, wcancel := context.WithTimeout(actx, askAgain)
		n, err = conn.WaitForNotification(wctx)
		wcancel()
		// An answer, a broken connection, or answerWait over: done. Else
		// (askAgain passed) the request goes again.
		if err == nil || actx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			break
		}
	}
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %s did not answer within %s (it runs a pgleader without resign requests, or its process is paused)", leader.ErrNoAnswer, from, answerWait)
	case err != nil:
		return err
	}
	switch msg := n.Payload; {
	case msg == "ok":
		return nil
	case strings.HasPrefix(msg, "unknown: "):
		return fmt.Errorf("%w: %s", leader.ErrNotCandidate, strings.TrimPrefix(msg, "unknown: "))
	default:
		return fmt.Errorf("%w: %s", leader.ErrRefused, strings.TrimPrefix(msg, "refused: "))
	}
}

// waitHandover waits, once the leader granted the request, for the next
// leader.
func waitHandover(ctx context.Context, conn *pgx.Conn, t *lockconn.Target, from, to string, began time.Time) (Handover, error) {
	for {
		h, _, err := holderOf(ctx, conn, t)
		if err != nil {
			return Handover{From: from}, err
		}
		// With a name, other candidates may hold the lock for an instant
		// (they give a reserved lock back in the statement that won it):
		// wait for the named one, until the leader's reservation ends.
		if h != "" && h != from && (to == "" || h == to || time.Since(began) > reservationEnds) {
			return Handover{From: from, To: h, Took: time.Since(began)}, nil
		}
		// Often at first, to time the handover; then every 50 ms while the
		// old leader's OnElected may still be draining.
		poll := 2 * time.Millisecond
		if time.Since(began) > 200*time.Millisecond {
			poll = 50 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return Handover{From: from}, fmt.Errorf("%s stepped down but no new leader was seen: %w", from, ctx.Err())
		case <-time.After(poll):
		}
	}
}

// reservationEnds: past it a leader has released its reservation for a
// named candidate (handoverQueueWait after its unlock, at most).
var reservationEnds = 2*handoverQueueWait + time.Second

// answerWait bounds how long RequestResign waits for the leader's answer.
// A leader reads its socket continuously between renews, so it answers in
// a round trip or two unless its process is paused.
var answerWait = 5 * time.Second

// holderOf returns the identity of t's holder (without the rank its
// application_name may carry) and its backend pid; "" when nobody holds
// it.
func holderOf(ctx context.Context, conn *pgx.Conn, t *lockconn.Target) (string, uint32, error) {
	app, pid, err := lockconn.Holder(ctx, conn, t)
	return identity(app), pid, err
}
