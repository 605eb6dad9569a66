package lockconn

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrTermBusy: the fencing term row is locked by an earlier leader's
// transaction, so the next term could not be installed in this round trip
// (the lock check in it succeeded).
var ErrTermBusy = errors.New("pgleader: fencing term row busy")

// NameMarker is the comment that opens an election's statements when its
// key has a name (leader.KeyFromName): "/* pgleader key <name in hex> */ ".
// pg_stat_activity shows a session's last statement, so pgleader status
// and the live page name an election whose leader keeps no fencing terms
// (a renew is a leader's last statement between renews). The name is in
// hex so that no name can end the comment. Prepared once, it costs
// nothing per round.
func NameMarker(k interface{ Name() string }) string {
	if k.Name() == "" {
		return ""
	}
	return "/* pgleader key " + hex.EncodeToString([]byte(k.Name())) + " */ "
}

// ParseNameMarker reads the name a statement's NameMarker carries, if any.
func ParseNameMarker(query string) (string, bool) {
	rest, ok := strings.CutPrefix(query, "/* pgleader key ")
	if !ok {
		return "", false
	}
	h, _, ok := strings.Cut(rest, " */")
	if !ok {
		return "", false
	}
	b, err := hex.DecodeString(h)
	if err != nil || len(b) == 0 {
		return "", false
	}
	return string(b), true
}

// Target is one advisory lock as a Lease campaigns for it: its tag and the
// SQL of every step, built once. A Lease takes a Target per call, so one
// session can hold many.
type Target struct {
	Tag
	holderSQL, waitSQL, trySQL, checkSQL, sessionSQL string
	unlockSQL                                        string // a quiet session's unlock
	bumpSQL                                          string // "" without fencing
	bumpArgs                                         []any
	mark                                             string // NameMarker of the key
	values                                           bool   // see WatchValues
}

// WatchValues makes a quiet campaign on t look the holder up as soon as the
// known leader announces itself again (a value it proclaimed), and mark
// every lookup's round Round.Refresh, so that the caller reads the value:
// a lookup follows every announcement, the new leader's own included.
func (t *Target) WatchValues() { t.values = true }

// NewTarget builds the Target of a key. With fencing, bumpSQL installs
// the next term (its arguments: classid, objid, objsubid, keyName,
// identity); "" without.
func NewTarget(k KeyLike, bumpSQL, keyName, identity string) *Target {
	t := &Target{Tag: TagOf(k)}
	mark := NameMarker(k)
	t.mark = mark
	t.holderSQL = mark + t.HolderSQL()
	t.waitSQL = mark + t.AcquireSQL("pg_advisory_lock")
	t.trySQL = mark + t.AcquireSQL("pg_try_advisory_lock")
	t.checkSQL = mark + t.CheckSQL()
	t.sessionSQL = mark + t.SessionCheckSQL()
	// A quiet session's unlock also turns its server-side lease off (it
	// holds nothing now), and when no heir took the lock at once (the
	// probe finds it free) it announces the vacancy with an empty NOTIFY,
	// so that watchers poll now instead of at their next poll.
	n := len(t.Vals) + 1
	t.unlockSQL = fmt.Sprintf("SELECT u, set_config('idle_session_timeout', '0', false), "+
		"CASE WHEN u AND pg_try_advisory_lock_shared(%s) AND pg_advisory_unlock_shared(%s) THEN pg_notify($%d, '') END IS NOT NULL, "+
		"set_config('lock_timeout', '0', true) "+ // its NOTIFY's commit: see notifySQL
		"FROM (SELECT pg_advisory_unlock(%s) u) s", t.Args, t.Args, n, t.Args)
	if bumpSQL != "" {
		t.bumpSQL = bumpSQL
		t.bumpArgs = []any{t.ClassID, t.ObjID, t.ObjSubID, keyName, identity}
	}
	return t
}

// SetBump replaces the statement that installs a new term (see NewTarget).
func (t *Target) SetBump(bumpSQL string) { t.bumpSQL = bumpSQL }

// Record runs one bookkeeping statement (a history row) on the session.
// Never while it waits for a lock.
func (l *Lease) Record(ctx context.Context, sql string, args ...any) error {
	_, err := l.conn.Exec(ctx, sql, args...)
	return err
}

// Round is what one campaign round saw.
type Round struct {
	// Holder is the holder's application_name ("" when it has none) and
	// HolderPID its backend pid,
	// when another session held the lock at the start of the round. A
	// nameless holder is never reported as a leader: it is no elector's
	// identity.
	Holder    string
	HolderPID int32
	// Free: nobody held the lock at the start of the round. (Neither Free
	// nor a Holder: this session held it.)
	Free bool
	// Busy: the lock wait ended in lock_timeout (or the try found the lock
	// held). A grant can race the timeout, so the lock may be held anyway:
	// the next round tells.
	Busy bool
	// Already: this session's backend held the lock before the round.
	Already bool
	// Held: this session's backend holds the lock after the round.
	Held bool
	// Refresh: the round was a lookup that an announcement made due (with
	// Target.WatchValues): the leader's value may have changed.
	Refresh bool
	// Proven: the round itself showed that the session's own backend (its
	// pid and token) holds the lock, so no separate check is needed.
	Proven bool
	// Woken: another session of this role ended the round's lock wait (a
	// new leader's announcement, or a leader's reservation for another
	// candidate; see pgleader_wake).
	Woken bool
	// Sent is when the round's statement was sent (a watcher's round
	// first waits idle for its poll), or, for a lock an heir's wait was
	// granted, that plus how long the wait took before the grant as the
	// server measured it (see grantedFrom): a trust window that a Proven
	// round opens runs from then.
	Sent time.Time
}

// Lease is one dedicated session that campaigns for, confirms, renews and
// releases advisory locks. It owns its connection, the backend pid and the
// session token. Its methods are not safe for concurrent use.
type Lease struct {
	conn       *pgx.Conn
	sess       Session
	funcsTried bool
	funcs      bool // the quiet functions exist in this session
	// f is the quiet campaign on this session (nil: the plain round); see
	// Watch.
	f          *follower
	listening  bool  // for resign requests (see Announce)
	watchedPID int32 // the holder the last Watch saw
	lookups    int   // holder lookups the quiet campaign made (tests)
	identity   string
}

// Open configures conn as a lock session (see Setup) and returns its Lease,
// which then owns conn. On an error conn is left to the caller.
func Open(ctx context.Context, conn *pgx.Conn, s Settings) (*Lease, error) {
	sess, err := Setup(ctx, conn, s)
	if err != nil {
		return nil, err
	}
	return &Lease{conn: conn, sess: sess, identity: s.Identity}, nil
}

// Prove checks that the session is its backend's only client (see the
// function Prove).
func (l *Lease) Prove(ctx context.Context, connect func(context.Context) (*pgx.Conn, error)) error {
	return Prove(ctx, l.sess, connect)
}

// PID is the session's backend pid.
func (l *Lease) PID() uint32 { return l.sess.PID }

// Major is the server's major version.
func (l *Lease) Major() int { return l.sess.Major }

// Schemas are the schemas of the role's own search_path (see
// Session.Schemas).
func (l *Lease) Schemas() []string { return l.sess.Schemas }

// DeadlockTimeout is the server's deadlock_timeout, read at setup.
func (l *Lease) DeadlockTimeout() time.Duration { return l.sess.DeadlockTimeout }

// Conn is the session's connection, for setup steps such as creating the
// terms table. Never run anything on it while the Lease holds a lock.
func (l *Lease) Conn() *pgx.Conn { return l.conn }

// Campaign runs one campaign round in one pipelined round trip: it looks up
// the holder, then takes the lock, waiting for at most the session's
// lock_timeout (or, with try, not at all). The acquisition never stacks on
// a lock the backend already holds and never takes one on a standby
// (ErrStandby). A lock_timeout is not an error: it reads as Busy.
func (l *Lease) Campaign(ctx context.Context, t *Target, try bool) (Round, error) {
	if l.f != nil && !try {
		return l.quietCampaign(ctx, t)
	}
	b := &pgx.Batch{}
	b.Queue(t.holderSQL)
	sql := t.waitSQL
	if try {
		sql = t.trySQL
	}
	b.Queue(sql, t.Vals...)
	rd := Round{Sent: time.Now()}
	br := l.conn.SendBatch(ctx, b)
	defer br.Close()
	var err error
	if rd.Holder, rd.HolderPID, rd.Free, err = scanHolder(br.QueryRow()); err != nil {
		return rd, err
	}
	r, err := ScanAcquire(br.QueryRow())
	if IsLockTimeout(err) {
		br.Close() // returns the same lock timeout error
		rd.Busy = true
		return rd, nil
	}
	if err != nil {
		return rd, Pooling(err)
	}
	if err := l.sess.Same(r.PID, r.Token); err != nil {
		return rd, err
	}
	rd.Already, rd.Held, rd.Busy = r.Already, r.Held, !r.Held
	return rd, br.Close()
}

// scanHolder reads a HolderSQL row: the holder's application_name ("" when
// it has none) and pid when another session holds the lock; free when
// nobody does; all zero when this session does. Any role may take any
// advisory lock, with no application_name: never make up a name ("pid N"
// was one) that a follower would report as its leader.
func scanHolder(row pgx.Row) (holder string, pid int32, free bool, err error) {
	var own int32
	switch err := row.Scan(&holder, &pid, &own); {
	case errors.Is(err, pgx.ErrNoRows):
		return "", 0, true, nil
	case err != nil:
		return "", 0, false, Pooling(err)
	case pid == own:
		return "", 0, false, nil
	}
	return holder, pid, false, nil
}

// Adopt decides what a round that found the lock already held means. A
// wait can end in lock_timeout at the very moment the lock is granted;
// PostgreSQL then reports the timeout and the session keeps the lock. So
// after a Busy round the lock is possibly held, and a round that finds it
// held by this backend has won it. Without a Busy round before, this
// backend holding the lock means another client shares the server
// connection: ErrTransactionPooling.
func Adopt(r Round, possiblyHeld bool, pid uint32) (won bool, err error) {
	if r.Already && !possiblyHeld {
		return false, fmt.Errorf("%w: this session's backend (pid %d) already held the lock before it was taken", ErrTransactionPooling, pid)
	}
	return r.Held, nil
}

// Confirm proves, right after the lock was granted, that this session's
// own backend holds it (which also catches a transaction-pooling proxy:
// ErrTransactionPooling), and with fencing installs the next term in the
// same round trip. A term row locked by an earlier leader's transaction
// gives ErrTermBusy; the caller may try again.
func (l *Lease) Confirm(ctx context.Context, t *Target) (term int64, err error) {
	defer func() {
		if errors.Is(err, ErrLockLost) {
			err = fmt.Errorf("%w: the lock just taken is missing from pg_locks", ErrTransactionPooling)
		}
	}()
	if t.bumpSQL == "" {
		return 0, l.Renew(ctx, t)
	}
	b := &pgx.Batch{}
	b.Queue(t.checkSQL)
	b.Queue(durableSQL)
	b.Queue(t.bumpSQL, t.bumpArgs...)
	br := l.conn.SendBatch(ctx, b)
	defer br.Close()
	if err := CheckResult(br.QueryRow(), l.sess); err != nil {
		return 0, err
	}
	if _, err := br.Exec(); err != nil {
		return 0, err
	}
	err = br.QueryRow().Scan(&term)
	switch {
	case IsLockTimeout(err):
		br.Close()
		return 0, ErrTermBusy
	case err != nil:
		return 0, err
	}
	if err := br.Close(); err != nil {
		return 0, err
	}
	return term, durable(ctx)
}

// durableSQL makes the commit of its transaction wait for the synchronous
// standbys (synchronous_commit on; the session's own setting is local,
// see Setup): a fencing term must survive a failover, or a promoted
// standby would hand out the same term again.
const durableSQL = "SELECT set_config('synchronous_commit', 'on', true)"

// durable reports a durable write's commit as failed when ctx ended
// while it ran: a cancel during the commit's wait for a synchronous
// standby ends the wait with the transaction committed here only (the
// server says so in a WARNING), and that term is not proven durable.
// A connector whose context handling sends a cancel request could
// otherwise see it succeed.
func durable(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pgleader: the term's commit may not have reached the synchronous standbys: %w", err)
	}
	return nil
}

// notifySQL announces a new leader on its lock's channel. A NOTIFY's
// commit waits for the server-wide notify queue lock under lock_timeout,
// and a timeout there is an ERROR the server logs with no statement (and
// here it would fail a renew): the transaction turns lock_timeout off (the
// round trip's deadline bounds the wait), and needs no WAL flush (nothing
// durable is in it), which keeps the queue lock short for every notifier.
const notifySQL = `SELECT pg_notify($1, current_setting('application_name')), set_config('lock_timeout', '0', true), set_config('synchronous_commit', 'off', true)`

// Announce is a Renew that also announces this session as t's leader on
// t's channel, in the same round trip, for quiet followers and for
// observers (elector.Observe). A new leader sends it once OnElected has
// started, off the handover's critical path: the notification wakes every
// listening session's backend.
func (l *Lease) Announce(ctx context.Context, t *Target) error {
	l.dropHeard()
	b := &pgx.Batch{}
	b.Queue(notifySQL, t.Channel())
	// A leader listens for resign requests while it leads (see Unlock).
	b.Queue("LISTEN " + pgx.Identifier{t.ResignChannel()}.Sanitize())
	if l.wakes() {
		// In the same transaction: the heirs woken look the leader up in
		// pg_locks, where it holds the lock already (see pgleader_wake).
		b.Queue(t.mark+wakeCall, t.ClassID, t.ObjID, t.ObjSubID, l.f.slots)
	}
	if err := l.checked(ctx, t, b, func(err error) error {
		if IsLockTableFull(err) && !l.conn.IsClosed() {
			// A NOTIFY's commit takes a lock in the server's shared
			// lock table (the notify queue's), which another role may
			// have filled: the check proved the lock, the transaction
			// (the NOTIFY, the LISTEN) was rolled back, the session is
			// fine.
			return fmt.Errorf("%w: the leader was not announced: %w", ErrLockTableFull, err)
		}
		return nil
	}); err != nil {
		return err
	}
	l.listening = true
	return nil
}

// wakeCall ends the lock waits of t's heirs (see pgleader_wake).
const wakeCall = "SELECT pg_temp.pgleader_wake($1::oid, $2::oid, $3::int2, $4::int4[], NULL::text)"

// wakes reports whether this session wakes its heirs: it has the quiet
// functions and heir slots.
func (l *Lease) wakes() bool {
	return l.funcs && l.f != nil && len(l.f.slots) > 0
}

// wake ends the lock waits of t's heirs once a Proclaim's value is
// committed, so that they read it now rather than at their wait's end (an
// heir's wait lasts up to Quiet.Wait; Announce wakes them in its own
// round trip). It is a courtesy to them: a statement that fails changes
// nothing for this session, but a connection it found lost is reported,
// with the server's reason (a FATAL it read, such as 57P01 when the
// backend was terminated).
func (l *Lease) wake(ctx context.Context, t *Target) error {
	if !l.wakes() {
		return nil
	}
	if _, err := l.conn.Exec(ctx, t.mark+wakeCall, l.mode(), t.ClassID, t.ObjID, t.ObjSubID, l.f.slots); err != nil && l.conn.IsClosed() {
		return lostAfterCheck(err)
	}
	return nil
}

// checked sends t's check and then rest's statements in one round trip
// (one transaction), and reads them in order: the check's answer first
// (CheckResult), then each statement's. A statement's error, or the
// commit's (which the batch's end reports), goes to soft, when given,
// which may return the error to report with the session still fit (the
// rest of the batch is then drained); otherwise, and for a nil answer, it
// is a fault (lostAfterCheck). soft is called only once the check proved
// the lock.
func (l *Lease) checked(ctx context.Context, t *Target, rest *pgx.Batch, soft func(error) error) error {
	b := &pgx.Batch{QueuedQueries: append([]*pgx.QueuedQuery{{SQL: t.checkSQL}}, rest.QueuedQueries...)}
	br := l.conn.SendBatch(ctx, b)
	defer br.Close()
	if err := CheckResult(br.QueryRow(), l.sess); err != nil {
		return err
	}
	failed := func(err error) error {
		if soft != nil {
			if serr := soft(err); serr != nil {
				br.Close()
				return serr
			}
		}
		return lostAfterCheck(err)
	}
	for range rest.QueuedQueries {
		if _, err := br.Exec(); err != nil {
			return failed(err)
		}
	}
	if err := br.Close(); err != nil {
		return failed(err)
	}
	return nil
}

// dropHeard discards the notifications the connection has read and not
// yet handed out. Before a tenure's first renew (Announce) these are a
// follower's hints, useless to a leader, and resign requests an earlier
// tenure of this session heard after it decided to step down: addressed
// to this same backend, they would end the new tenure. None can arrive
// later: the session stopped listening for requests when it unlocked.
func (l *Lease) dropHeard() {
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for {
		if _, err := l.conn.WaitForNotification(done); err != nil {
			return
		}
	}
}

// requestFor returns the candidate a request payload names when it is
// addressed to the backend pid.
func requestFor(payload string, pid uint32) (string, bool) {
	to, ok := "", false
	if leaderPID, name, parsed := ParseRequest(payload); parsed && leaderPID == pid {
		to, ok = name, true
	}
	return to, ok
}

// lostAfterCheck names an error that came after a batch's check succeeded:
// the session ended under it (a server shutting down sends FATAL 57P01),
// or the deadline passed.
func lostAfterCheck(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %w", ErrRenewDeadline, err)
	case Pooling(err) != err:
		return Pooling(err)
	default:
		return fmt.Errorf("%w: %w", ErrConnectionLost, err)
	}
}

// Renew asks whether this session's backend holds the lock: nil when it
// does. ctx's deadline is the trust window: past it the error is
// ErrRenewDeadline.
func (l *Lease) Renew(ctx context.Context, t *Target) error {
	return CheckResult(l.conn.QueryRow(ctx, t.checkSQL, l.mode()), l.sess)
}

// RenewSession is Renew without pg_locks (see Tag.SessionCheckSQL): it
// proves the session (its backend, its token, a primary) and that no other
// session holds the lock or waits for it unless this backend holds it, at a
// small fraction of a pg_locks read, whose cost grows with the server's
// whole lock table. It cannot tell a lock this session holds from one it
// lost that nobody else took: an elector runs Renew at its tenure's start
// and every so many renews.
func (l *Lease) RenewSession(ctx context.Context, t *Target) error {
	return CheckResult(l.conn.QueryRow(ctx, t.sessionSQL, l.mode()), l.sess)
}

// mode is how the session sends its hot statements: a quiet session is
// proven to be its backend's only client (see the functions' guard), so
// it keeps them prepared and the server neither parses nor plans them
// again; any other session sends them unnamed, which a transaction pooler
// cannot break.
func (l *Lease) mode() pgx.QueryExecMode {
	if l.funcs {
		return pgx.QueryExecModeCacheStatement
	}
	return pgx.QueryExecModeExec
}

// WaitIdle reads the idle session until `until`, as the function WaitIdle
// does, and returns early with a resign request for t (see handover.go).
func (l *Lease) WaitIdle(ctx context.Context, t *Target, until time.Time) (Request, error) {
	for {
		wctx, cancel := context.WithDeadline(ctx, until)
		n, err := l.conn.WaitForNotification(wctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return Request{}, ctx.Err()
		case err == nil:
			// Only a request addressed to this backend (see
			// RequestPayload); any other is a copy meant for an earlier
			// leader, or garbage, and is dropped unread.
			if n.Channel != t.ResignChannel() || n.PID == l.sess.PID {
				continue
			}
			if to, ok := requestFor(n.Payload, l.sess.PID); ok {
				return Request{PID: n.PID, To: to}, nil
			}
			if leaderPID, r, ok := ParseRank(n.Payload); ok && leaderPID == l.sess.PID {
				return Request{PID: n.PID, Rank: &r}, nil
			}
		case errors.Is(err, context.DeadlineExceeded):
			return Request{}, nil
		default:
			return Request{}, fmt.Errorf("%w: %w", ErrConnectionLost, err)
		}
	}
}

// Unlock releases the lock once; it fails (ErrLockLost) when the lock was
// not held. A quiet session that holds nothing then turns its
// idle_session_timeout off in the same statement (see Quiet.Lease): it
// goes back to watching. Then, off the handover's path, the session stops
// listening for resign requests (a follower does not hear them).
func (l *Lease) Unlock(ctx context.Context, t *Target) error {
	if err := l.unlock(ctx, t); err != nil {
		return err
	}
	l.Stepped(t)
	if !l.listening {
		return nil
	}
	l.listening = false
	_, err := l.conn.Exec(ctx, "UNLISTEN "+pgx.Identifier{t.ResignChannel()}.Sanitize(), pgx.QueryExecModeSimpleProtocol)
	return err
}

func (l *Lease) unlock(ctx context.Context, t *Target) error {
	if l.f == nil || l.f.Lease <= 0 || l.f.heir >= 0 {
		return Unlock(ctx, l.conn, t.Tag)
	}
	var ok bool
	args := append(append([]any{l.mode()}, t.Vals...), t.Channel())
	if err := l.conn.QueryRow(ctx, t.unlockSQL, args...).Scan(&ok, new(string), new(bool), new(string)); err != nil {
		return err
	}
	if !ok {
		return ErrLockLost
	}
	return nil
}

// Close ends the session, which frees every lock it holds.
func (l *Lease) Close() { Close(l.conn) }
