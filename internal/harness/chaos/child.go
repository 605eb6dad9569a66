package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/pgleader/pgleader/elector"
	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/leader"
)

// Timings of the electors under test.
const (
	Interval = 100 * time.Millisecond
	Deadline = 500 * time.Millisecond
	Lease    = 1500 * time.Millisecond
)

// ChildEnv values.
const (
	RoleElector = "chaos-elector"
	RoleBroken  = "chaos-broken" // skips every check: the checker must catch it
)

// ReleaseTimeout is longer than the longest slow drain the schedule asks
// for (3 x Lease).
const ReleaseTimeout = 4 * Lease

const writesDDL = `CREATE TABLE IF NOT EXISTS chaos_writes (id bigserial PRIMARY KEY, term bigint NOT NULL, seq bigint NOT NULL, writer text NOT NULL)`

// ChildMain runs one elector process of the harness. It reports elected,
// ctxdone, returned and demoted events on stdout, writes fenced rows while
// leading, and on stdin EOF stops, checks itself for leaked goroutines and
// reports "exited". Commands on stdin: "drain D" makes the current
// tenure's OnElected keep working (and writing) for D after its context
// ends; "resign" resigns.
func ChildMain(role string) int {
	em := testpg.NewEmitter(os.Stdout)
	dsn, id := os.Getenv("CHAOS_DSN"), os.Getenv("CHAOS_ID")
	key := leader.KeyFromName(os.Getenv("CHAOS_KEY"))
	priority, _ := strconv.Atoi(os.Getenv("CHAOS_PRIORITY"))
	ctx, cancel := context.WithCancel(context.Background())
	var drain atomic.Int64
	var el atomic.Pointer[elector.Elector]
	var groupResign atomic.Pointer[func()]
	go func() { // stdin closes when the harness wants us to stop
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			cmd, arg, _ := strings.Cut(sc.Text(), " ")
			switch cmd {
			case "drain":
				d, _ := time.ParseDuration(arg)
				drain.Store(int64(d))
			case "resign":
				if e := el.Load(); e != nil {
					go e.Resign(ctx)
				}
				if f := groupResign.Load(); f != nil {
					(*f)()
				}
			}
		}
		cancel()
	}()
	switch role {
	case RoleBroken:
		return brokenMain(ctx, em, dsn, id, key)
	case RoleGroup:
		return groupMain(ctx, em, dsn, id, &drain, &groupResign)
	case RoleGroupBroken:
		return brokenGroupMain(ctx, em, dsn, id)
	}
	starve := newStarveWatch(ctx)
	e, err := elector.New(elector.Config{
		Connect: elector.DSN(dsn), Key: key, Identity: id, Priority: priority,
		RenewInterval: Interval, RenewDeadline: Deadline, LeaseDuration: Lease, ReleaseTimeout: ReleaseTimeout,
		Fencing:  elector.Fencing{Enabled: true},
		Observer: starve,
		Callbacks: elector.Callbacks{
			OnElected: func(ctx context.Context, l leader.Leadership) {
				em.Emit(testpg.Event{Ev: "elected", Identity: id, Term: l.Term})
				stopWriting, stop := context.WithCancel(context.Background())
				defer stop()
				var refused int
				wrote := make(chan struct{})
				go func() { defer close(wrote); refused = writeWhileLeading(stopWriting, dsn, l, starve.note) }()
				<-ctx.Done() // the belief ends here
				em.Emit(testpg.Event{Ev: "ctxdone", Identity: id, Term: l.Term, Err: leader.ReasonLabel(context.Cause(ctx))})
				// A slow drain: flushing and committing go on, fenced, while
				// the elector keeps the lock.
				if d := time.Duration(drain.Swap(0)); d > 0 {
					began := time.Now()
					time.Sleep(d)
					stop()
					<-wrote
					em.Emit(testpg.Event{Ev: "returned", Identity: id, Term: l.Term, Data: fmt.Sprintf("drain refused=%d", refused),
						Err: fmt.Sprintf("starved=%s", starve.worstSince(began))})
					return
				}
				stop()
				<-wrote
				em.Emit(testpg.Event{Ev: "returned", Identity: id, Term: l.Term})
			},
			OnDemoted: func(l leader.Leadership, reason error) {
				em.Emit(testpg.Event{Ev: "demoted", Identity: id, Term: l.Term, Err: leader.ReasonLabel(reason)})
				// The reason's text, for a violation's report (Data is a
				// group's key in "demoted").
				em.Emit(testpg.Event{Ev: "why", Identity: id, Term: l.Term, Err: reason.Error()})
			},
			OnNewLeader: func(leader string) {
				em.Emit(testpg.Event{Ev: "leaderseen", Identity: id, Data: leader})
			},
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	el.Store(e)
	err = e.Run(ctx)
	leaks := ""
	if lerr := goleak.Find(goleak.IgnoreCurrent()); lerr != nil {
		leaks = lerr.Error()
	}
	em.Emit(testpg.Event{Ev: "exited", Identity: id, Err: fmt.Sprint(err), Data: leaks})
	return 0
}

// writeWhileLeading makes a fenced write every 20ms until ctx ends, and
// keeps trying for 50ms after, as a slow leader would: Fence must refuse
// those once a newer term exists. It returns how many writes made before
// ctx ended were refused by Fence.
//
// note gets the time each write took that was not refused (committed, or
// cut off by its 300 ms deadline): a slow one says the server was starved
// (see starveWatch).
func writeWhileLeading(ctx context.Context, dsn string, l leader.Leadership, note func(time.Duration)) (refused int) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	var stopAt time.Time
	for seq := int64(0); ; seq++ {
		if ctx.Err() != nil && stopAt.IsZero() {
			stopAt = time.Now().Add(50 * time.Millisecond)
		}
		if !stopAt.IsZero() && time.Now().After(stopAt) {
			return refused
		}
		wctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		if conn == nil || conn.IsClosed() {
			conn, _ = pgx.Connect(wctx, dsn)
		}
		if conn != nil {
			began := time.Now()
			err := pgx.BeginFunc(wctx, conn, func(tx pgx.Tx) error {
				if err := l.Fence(wctx, tx); err != nil {
					return err
				}
				_, err := tx.Exec(wctx, `INSERT INTO chaos_writes (term, seq, writer) VALUES ($1, $2, $3)`, l.Term, seq, l.Identity)
				return err
			})
			switch {
			case errors.Is(err, leader.ErrFenced):
				if stopAt.IsZero() {
					refused++
				}
			case err == nil || wctx.Err() != nil:
				note(time.Since(began))
			}
		}
		cancel()
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// brokenMain is an "elector" that takes the lock once and then believes it
// leads forever: no renew check, unfenced writes under a term it claimed.
func brokenMain(ctx context.Context, em *testpg.Emitter, dsn, id string, key leader.Key) int {
	args, vals := key.SQLArgs(1)
	classid, objid, objsubid := key.LockTag()
	for ctx.Err() == nil {
		conn, err := pgx.Connect(ctx, dsn+"&application_name="+id)
		if err != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		var ok bool
		for !ok && ctx.Err() == nil {
			if conn.QueryRow(ctx, "SELECT pg_try_advisory_lock("+args+")", vals...).Scan(&ok) != nil {
				break
			}
			if !ok {
				time.Sleep(50 * time.Millisecond)
			}
		}
		if !ok {
			conn.Close(context.Background())
			continue
		}
		var term int64
		conn.QueryRow(ctx, `INSERT INTO pgleader_terms VALUES ($1, $2, $3, $4, 1, $5, now())
			ON CONFLICT (classid, objid, objsubid) DO UPDATE SET term = pgleader_terms.term + 1 RETURNING term`,
			classid, objid, objsubid, key.String(), id).Scan(&term)
		em.Emit(testpg.Event{Ev: "elected", Identity: id, Term: term})
		w := &staleWriter{dsn: dsn}
		for seq := 0; ctx.Err() == nil; seq++ {
			w.exec(ctx, `INSERT INTO chaos_writes (term, seq, writer) VALUES ($1, $2, $3)`, term, seq, id)
			time.Sleep(20 * time.Millisecond)
		}
		w.close()
	}
	em.Emit(testpg.Event{Ev: "exited", Identity: id})
	return 0
}

// staleWriter is a broken elector's writer: it keeps writing under the
// terms it claimed whatever happens to its connection (a fault on the
// broken process cuts it too), reconnecting as needed, so that the
// checker always has its stale writes to catch.
type staleWriter struct {
	dsn  string
	conn *pgx.Conn
}

// exec runs one write, with a deadline (a black-holed proxy), on a
// connection it opens again when the last one broke; failures are
// ignored: the next write tries again.
func (w *staleWriter) exec(ctx context.Context, sql string, args ...any) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if w.conn == nil || w.conn.IsClosed() {
		c, err := pgx.Connect(ctx, w.dsn)
		if err != nil {
			return
		}
		w.close()
		w.conn = c
	}
	w.conn.Exec(ctx, sql, args...)
}

func (w *staleWriter) close() {
	if w.conn != nil {
		w.conn.Close(context.Background())
		w.conn = nil
	}
}

// starveWatch measures how starved this process and its server were: the
// lateness of a 10 ms ticker (the process not run), each fenced write's
// time and, for an elector, each renew's latency (the server or the
// network slow), kept with when they were seen. A drain whose renews missed the trust window with
// nothing starved is a bug; with a starved process it is the
// paused-process case, which only fencing orders (see starvedDrain).
type starveWatch struct {
	leader.NopObserver
	mu     sync.Mutex
	stalls []stall // the last 1024 of at least 10 ms
}

type stall struct {
	at time.Time
	d  time.Duration
}

func newStarveWatch(ctx context.Context) *starveWatch {
	w := &starveWatch{}
	go func() {
		const tick = 10 * time.Millisecond
		t := time.NewTicker(tick)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				w.note(now.Sub(last) - tick)
				last = now
			}
		}
	}()
	return w
}

func (w *starveWatch) note(d time.Duration) {
	if d < 10*time.Millisecond {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.stalls) == 1024 {
		w.stalls = w.stalls[1:]
	}
	w.stalls = append(w.stalls, stall{at: time.Now(), d: d})
}

// Renewed notes a renew's latency.
func (w *starveWatch) Renewed(_ leader.Leadership, latency time.Duration) { w.note(latency) }

// worstSince is the longest stall seen since t.
func (w *starveWatch) worstSince(t time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	var worst time.Duration
	for _, s := range w.stalls {
		if !s.at.Before(t) {
			worst = max(worst, s.d)
		}
	}
	return worst
}
