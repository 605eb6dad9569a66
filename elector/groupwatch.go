package elector

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/pgleader/pgleader/internal/lockconn"
	"github.com/pgleader/pgleader/internal/timing"
	"github.com/pgleader/pgleader/leader"
)

// The crash watch. A member that dies (SIGKILL, OOM, a crashed node whose
// kernel still closes the socket) loses its locks at once: the server ends
// its backend when the socket closes. The survivors would see that at
// their next round, up to RenewInterval later. To see it at once, each
// member holds a member lock of its own (exclusive, on its main session,
// in HeirClass's space, named after the group and its identity), and a
// second connection, the watch, queues in share mode on the member lock of
// the next member in name order (a ring: each member is watched by one
// other). The watched member's death grants the wait; the watch then has
// its own member run a full round at once, which tells the group from the
// member's main session (whose pid the others know, so that they believe
// it), and every member runs a round.
//
// The watch is quiet like a follower: its wait runs inside a session
// function whose exception block catches lock_timeout (no server log line),
// and each wait is shorter than deadlock_timeout (no deadlock detector
// run). It holds nothing when it returns: a wait that was granted, or that
// timed out at the instant of the grant, ends with pg_advisory_unlock_all()
// on a session that holds no other lock. The watch takes no part in
// safety: the keys are taken, as always, by try-locks on the main
// session after a round that read the roster; a watch that fails only
// delays detection to the next round, and is retried.

// memberLock is the second half of the member lock of identity in group.
func memberLock(group, identity string) int32 {
	h := fnv.New32a()
	fmt.Fprintf(h, "member|%s|%s", group, identity)
	return int32(h.Sum32())
}

// ringFunc is the watch's session function: it waits up to wait_ms for the
// member lock (a, b) in share mode, reports whether its holder is gone, and
// holds nothing when it returns. NULL on a standby.
const ringFunc = `CREATE OR REPLACE FUNCTION pg_temp.pgleader_ring(a int4, b int4, wait_ms int) RETURNS bool
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $f$
DECLARE
  gone bool;
BEGIN
  IF pg_is_in_recovery() THEN
    RETURN NULL;
  END IF;
  BEGIN
    PERFORM set_config('lock_timeout', wait_ms::text, true);
    PERFORM pg_advisory_lock_shared(a, b);
  EXCEPTION WHEN lock_not_available THEN
  END;
  gone := pg_try_advisory_lock_shared(a, b);
  PERFORM pg_advisory_unlock_all();
  RETURN gone;
EXCEPTION WHEN query_canceled THEN
  -- The member stops: its cancel request ends the wait without an error
  -- in the server log.
  PERFORM pg_advisory_unlock_all();
  RETURN false;
END $f$`

// reportGone has the next round run at once, and tell the group that
// member is gone.
func (g *Group) reportGone(member string) {
	g.mu.Lock()
	g.goneOut = append(g.goneOut, lockconn.GroupMessage{Kind: lockconn.GroupGone, Member: member})
	g.gone[member] = time.Now()
	g.fullSoon = true
	g.mu.Unlock()
	g.poke()
}

// ringNext returns the member after me in name order ("" when alone or
// not listed).
func ringNext(members []string, me string) string {
	i := slices.Index(members, me)
	if i < 0 || len(members) < 2 {
		return ""
	}
	return members[(i+1)%len(members)]
}

// watchRing runs the crash watch until ctx ends: it follows the member
// targets sends (the ring successor after each round).
func (g *Group) watchRing(ctx context.Context, targets <-chan string) {
	c := g.cfg
	r := timing.NewRetry(timing.Durations{RenewInterval: c.RenewInterval, LeaseDuration: c.LeaseDuration, ReconnectMaxDelay: c.ReconnectMaxDelay})
	target := ""
	for ctx.Err() == nil {
		began := time.Now()
		err := g.watchSession(ctx, targets, &target)
		if ctx.Err() != nil {
			return
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "42501" || pgErr.Code == "25006") {
			// No TEMP privilege, or a read-only role: every new session
			// would fail the same way, with an ERROR in the server's log.
			g.log.Warn("crash watch off for this process: its session function cannot be created (no TEMP privilege, or a read-only role); a member's death is seen at the next round instead", zap.Error(err))
			return
		}
		attempt, delay := r.Next(time.Since(began), err)
		delay = max(delay, c.RenewInterval)
		g.log.Debug("crash watch: reconnecting", zap.Int("attempt", attempt), zap.Duration("delay", delay), zap.Error(err))
		if !timing.Sleep(ctx, delay) {
			return
		}
	}
}

// watchSession is one connection's life of the crash watch.
func (g *Group) watchSession(ctx context.Context, targets <-chan string, target *string) error {
	c := g.cfg
	cctx, cancel := context.WithTimeout(ctx, c.LeaseDuration)
	defer cancel()
	conn, err := c.Connect.Connect(cctx)
	if err != nil {
		return err
	}
	defer lockconn.Close(conn)
	sess, err := lockconn.Setup(cctx, conn, lockconn.Settings{Identity: c.Identity, LockTimeout: c.RenewInterval, Lease: c.LeaseDuration, KeepIdle: c.RenewDeadline})
	if err != nil {
		return err
	}
	if _, err := conn.Exec(cctx, ringFunc, pgx.QueryExecModeSimpleProtocol); err != nil {
		return err
	}
	cancel()
	wait := c.RenewDeadline
	if sess.DeadlockTimeout > 0 {
		wait = min(wait, sess.DeadlockTimeout*4/5)
	}
	wait = max(wait, time.Millisecond)
	// Stopping cancels a wait in progress with a cancel request, which the
	// function catches (no log line), so that Run returns at once rather
	// than after the wait. Only a wait in progress is cancelled: a cancel
	// that reached the idle backend would do nothing, and no call follows.
	var mu sync.Mutex
	inCall := false
	cancelWait := func() {
		mu.Lock()
		defer mu.Unlock()
		if inCall {
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			conn.PgConn().CancelRequest(cctx)
		}
	}
	// A stop's cancel request goes out before the session closes: when
	// the AfterFunc has begun, wait for it to finish.
	stopped := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(stopped)
		cancelWait()
	})
	defer func() {
		if !stop() {
			<-stopped
		}
	}()
	for {
		// Follow the latest target; with none, wait for one.
		for drained := false; !drained; {
			select {
			case t := <-targets:
				*target = t
			case <-ctx.Done():
				return nil
			default:
				drained = true
			}
		}
		if *target == "" {
			select {
			case t := <-targets:
				*target = t
				continue
			case <-ctx.Done():
				return nil
			}
		}
		// A wait ends by itself within wait, or by the cancel request a
		// stop sends (caught in the function); the client-side deadline
		// only catches a silent network.
		mu.Lock()
		if ctx.Err() != nil {
			mu.Unlock()
			return nil
		}
		inCall = true
		mu.Unlock()
		// A new target (the members changed) ends the wait the same way,
		// so that the new successor is watched at once.
		callDone, moved, finished := make(chan struct{}), make(chan string, 1), make(chan struct{})
		go func() {
			defer close(finished)
			select {
			case t := <-targets:
				moved <- t
				cancelWait()
			case <-callDone:
			}
		}()
		wctx, cancel := context.WithTimeout(context.Background(), wait+c.RenewDeadline)
		var gone *bool
		err := conn.QueryRow(wctx, `SELECT pg_temp.pgleader_ring($1, $2, $3)`,
			lockconn.HeirClass, memberLock(c.Group, *target), int32(max(1, wait.Milliseconds()))).Scan(&gone)
		cancel()
		mu.Lock()
		inCall = false
		mu.Unlock()
		close(callDone)
		<-finished
		retargeted := false
		select {
		case t := <-moved:
			*target, retargeted = t, true
		default:
		}
		if ctx.Err() != nil {
			return nil
		}
		g.mu.Lock()
		g.stats.watchWaits++
		g.mu.Unlock()
		if err != nil {
			return err
		}
		if gone == nil {
			return fmt.Errorf("crash watch: %w", leader.ErrStandby)
		}
		if *gone && !retargeted {
			g.log.Debug("crash watch: a member is gone", zap.String("member", *target))
			g.reportGone(*target)
			// Watch it again only once a round named the next target.
			*target = ""
		}
	}
}
