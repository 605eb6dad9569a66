package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/pgleader/pgleader/group"
	"github.com/pgleader/pgleader/internal/testpg"
	"github.com/pgleader/pgleader/leader"
)

// RoleGroup is a member of an group.Group (Config.Group);
// RoleGroupBroken is a broken one, which the checker must catch.
const (
	RoleGroup       = "chaos-group"
	RoleGroupBroken = "chaos-group-broken"
)

const groupWritesDDL = `CREATE TABLE IF NOT EXISTS chaos_group_writes (id bigserial PRIMARY KEY, key text NOT NULL, term bigint NOT NULL, seq bigint NOT NULL, writer text NOT NULL)`

// groupKeyName is the name of the group's i-th key.
func groupKeyName(group string, i int) string { return fmt.Sprintf("%s/%d", group, i) }

// groupTenure is one key's tenure in a member process, for its writer.
type groupTenure struct {
	l       leader.Leadership
	refused atomic.Int64 // fenced writes refused before OnElected returned
}

// groupMain runs one member of the group CHAOS_KEY with CHAOS_KEYS keys.
// Per key it reports elected, ctxdone, returned and demoted (Data: the
// key's name; a slow drain's "returned" carries "drain refused=N
// starved=D" in Err: see starveWatch),
// and one writer makes a fenced write for every key it leads every 30ms,
// until that key's OnElected has returned. Commands: "drain D" (every
// OnElected of the member keeps working D after its context ends) and
// "resign" (one key).
func groupMain(ctx context.Context, em *testpg.Emitter, dsn, id string, drain *atomic.Int64, resign *atomic.Pointer[func()]) int {
	name := os.Getenv("CHAOS_KEY")
	n, _ := strconv.Atoi(os.Getenv("CHAOS_KEYS"))
	var keys []leader.Key
	for i := range n {
		keys = append(keys, leader.KeyFromName(groupKeyName(name, i)))
	}
	var mu sync.Mutex
	active := map[string]*groupTenure{}
	drained := map[string]time.Duration{} // keys resigned with a slow drain
	starve := newStarveWatch(ctx)
	g, err := group.New(group.Config{
		Connect: leader.DSN(dsn), Group: name, Keys: keys, Identity: id,
		RenewInterval: Interval, RenewDeadline: Deadline, LeaseDuration: Lease, ReleaseTimeout: ReleaseTimeout,
		Fencing: group.Fencing{Enabled: true},
		Callbacks: group.Callbacks{
			OnElected: func(ctx context.Context, l leader.Leadership) {
				name := l.Key.Name()
				t := &groupTenure{l: l}
				em.Emit(testpg.Event{Ev: "elected", Identity: id, Term: l.Term, Data: name})
				mu.Lock()
				active[name] = t
				mu.Unlock()
				<-ctx.Done()
				em.Emit(testpg.Event{Ev: "ctxdone", Identity: id, Term: l.Term, Data: name, Err: leader.ReasonLabel(context.Cause(ctx))})
				// A slow drain: the key resigned after "drain D", or every key
				// when the member is stopped after it.
				mu.Lock()
				d := drained[name]
				delete(drained, name)
				mu.Unlock()
				if errors.Is(context.Cause(ctx), context.Canceled) {
					d = time.Duration(drain.Load())
				}
				began := time.Now()
				if d > 0 {
					time.Sleep(d)
				}
				mu.Lock()
				if active[name] == t {
					delete(active, name)
				}
				mu.Unlock()
				ev := testpg.Event{Ev: "returned", Identity: id, Term: l.Term, Data: name}
				if d > 0 {
					ev.Err = fmt.Sprintf("drain refused=%d starved=%s", t.refused.Load(), starve.worstSince(began))
				}
				em.Emit(ev)
			},
			OnDemoted: func(l leader.Leadership, reason error) {
				em.Emit(testpg.Event{Ev: "demoted", Identity: id, Term: l.Term, Data: l.Key.Name(), Err: leader.ReasonLabel(reason)})
			},
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	f := func() {
		if owned := g.Owned(); len(owned) > 0 {
			mu.Lock()
			drained[owned[0].Name()] = time.Duration(drain.Swap(0))
			mu.Unlock()
			go g.Resign(ctx, owned[0])
		}
	}
	resign.Store(&f)
	wctx, stopWriter := context.WithCancel(context.Background())
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		groupWriter(wctx, dsn, &mu, active, starve.note)
	}()
	err = g.Run(ctx)
	stopWriter()
	<-wrote
	leaks := ""
	if lerr := goleak.Find(goleak.IgnoreCurrent()); lerr != nil {
		leaks = lerr.Error()
	}
	em.Emit(testpg.Event{Ev: "exited", Identity: id, Err: fmt.Sprint(err), Data: leaks})
	return 0
}

// groupWriter makes a fenced write for each tenure in active every 30ms,
// on one connection, until ctx ends.
func groupWriter(ctx context.Context, dsn string, mu *sync.Mutex, active map[string]*groupTenure, note func(time.Duration)) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	for seq := int64(0); ctx.Err() == nil; seq++ {
		mu.Lock()
		ts := make([]*groupTenure, 0, len(active))
		for _, t := range active {
			ts = append(ts, t)
		}
		mu.Unlock()
		for _, t := range ts {
			wctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			if conn == nil || conn.IsClosed() {
				conn, _ = pgx.Connect(wctx, dsn)
			}
			if conn != nil {
				began := time.Now()
				err := pgx.BeginFunc(wctx, conn, func(tx pgx.Tx) error {
					if err := t.l.Fence(wctx, tx); err != nil {
						return err
					}
					_, err := tx.Exec(wctx, `INSERT INTO chaos_group_writes (key, term, seq, writer) VALUES ($1, $2, $3, $4)`, t.l.Key.Name(), t.l.Term, seq, t.l.Identity)
					return err
				})
				switch {
				case errors.Is(err, leader.ErrFenced):
					t.refused.Add(1)
				case err == nil || wctx.Err() != nil:
					note(time.Since(began)) // a slow write: the server was starved
				}
			}
			cancel()
		}
		select {
		case <-ctx.Done():
		case <-time.After(30 * time.Millisecond):
		}
	}
}

// brokenGroupMain is a "member" that takes every key it can once and then
// believes it leads them for ever: no renew, no check, unfenced writes
// under the terms it claimed.
func brokenGroupMain(ctx context.Context, em *testpg.Emitter, dsn, id string) int {
	group := os.Getenv("CHAOS_KEY")
	n, _ := strconv.Atoi(os.Getenv("CHAOS_KEYS"))
	conn, err := pgx.Connect(ctx, dsn+"&application_name="+id)
	if err != nil {
		return 1
	}
	defer conn.Close(context.Background())
	type claim struct {
		name string
		term int64
	}
	var claims []claim
	for i := range n {
		k := leader.KeyFromName(groupKeyName(group, i))
		args, vals := k.SQLArgs(1)
		var ok bool
		if conn.QueryRow(ctx, "SELECT pg_try_advisory_lock("+args+")", vals...).Scan(&ok) != nil || !ok {
			continue
		}
		c, o, sub := k.LockTag()
		var term int64
		conn.QueryRow(ctx, `INSERT INTO pgleader_terms VALUES ($1, $2, $3, $4, 1, $5, now())
			ON CONFLICT (classid, objid, objsubid) DO UPDATE SET term = pgleader_terms.term + 1 RETURNING term`,
			c, o, sub, k.String(), id).Scan(&term)
		claims = append(claims, claim{k.Name(), term})
		em.Emit(testpg.Event{Ev: "elected", Identity: id, Term: term, Data: k.Name()})
	}
	w := &staleWriter{dsn: dsn}
	defer w.close()
	for seq := 0; ctx.Err() == nil; seq++ {
		for _, c := range claims {
			w.exec(ctx, `INSERT INTO chaos_group_writes (key, term, seq, writer) VALUES ($1, $2, $3, $4)`, c.name, c.term, seq, id)
		}
		time.Sleep(20 * time.Millisecond)
	}
	em.Emit(testpg.Event{Ev: "exited", Identity: id})
	return 0
}
