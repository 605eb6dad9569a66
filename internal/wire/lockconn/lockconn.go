// Package lockconn is the wire layer under the elector and lock packages.
// A Lease is one dedicated session: Open configures it in one round trip
// (application_name, lock_timeout, the server-side lease, keepalives, a
// session token, the standby check); Campaign runs a round (holder lookup
// and guarded acquisition, pipelined); Adopt decides a grant that raced its
// timeout; Confirm proves the grant and installs a fencing term; Renew
// checks pg_locks for the session's own backend; WaitIdle reads the idle
// socket; Unlock releases. Target holds a key's SQL, built once; a Lease
// takes one per call, so one session can serve many keys. The SQLSTATE
// predicates (IsLockTimeout, Pooling) live here too. It imports nothing else
// of the module.
//
// The statements a leader or a group member runs while it holds locks (a
// renew, a full round) and a follower's holder lookups read no shared
// catalog (pg_database, pg_authid, nor the pg_stat_activity view, which
// joins them): a relation lock on a shared catalog cannot take the
// per-backend fast path, so while another role has filled the server's
// lock table such a statement fails with SQLSTATE 53200, and a renew that
// fails ends a tenure. pg_locks and pg_stat_get_activity take no lock.
package lockconn

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Errors; the leader package re-exports them.
var (
	ErrConnectionLost     = errors.New("pgleader: connection lost")
	ErrLockLost           = errors.New("pgleader: advisory lock no longer held")
	ErrRenewDeadline      = errors.New("pgleader: renew deadline exceeded")
	ErrTransactionPooling = errors.New("pgleader: connection is behind a transaction-pooling proxy (e.g. PgBouncer pool_mode=transaction); session advisory locks need a direct connection or session pooling")
	ErrStandby            = errors.New("pgleader: the server is a standby (in recovery); advisory locks taken there do not exclude the primary's holders: connect to the primary, or list every host in the DSN with target_session_attrs=primary (or read-write)")
)

// SQLSTATE codes.
const (
	LockNotAvailable = "55P03" // lock_timeout ended a lock wait
	// Prepared statements that vanish or collide: the classic symptoms of a
	// transaction-pooling proxy.
	duplicatePreparedStatement = "42P05"
	invalidSQLStatementName    = "26000"
	// The session's own pg_temp functions are missing: the statement ran
	// on another backend.
	undefinedFunction = "42883"
	invalidSchemaName = "3F000" // schema "pg_temp" does not exist: as above
)

// Tag is an advisory lock's identity in pg_locks, and its argument list for
// the advisory-lock functions.
type Tag struct {
	ClassID, ObjID uint32
	ObjSubID       int16
	Args           string // e.g. "$1::int8"
	Vals           []any
}

// KeyLike is what a leader.Key offers (lockconn cannot import leader).
type KeyLike interface {
	Name() string
	LockTag() (classid, objid uint32, objsubid int16)
	SQLArgs(first int) (string, []any)
}

// TagOf builds the Tag of a key.
func TagOf(k KeyLike) Tag {
	c, o, s := k.LockTag()
	args, vals := k.SQLArgs(1)
	return Tag{ClassID: c, ObjID: o, ObjSubID: s, Args: args, Vals: vals}
}

// The SQL below is compact on purpose: without prepared statements its text
// goes over the wire on every round.

// where matches the lock granted in exclusive mode, the only mode a
// leader holds it in. A shared hold is no leadership: a follower's probe
// holds the key shared for an instant while it is free, and any role may
// hold it shared for as long as it likes; neither is a leader, and a
// session that holds it only shared does not lead.
func (t Tag) where() string {
	return fmt.Sprintf("l.locktype='advisory' AND l.classid=%d AND l.objid=%d AND l.objsubid=%d AND l.granted AND l.mode='ExclusiveLock'", t.ClassID, t.ObjID, t.ObjSubID)
}

// CheckSQL returns the session's backend pid, its owner token, whether
// that backend holds the lock (granted), reading pg_locks for its own pid,
// and whether the server is in recovery (a standby).
func (t Tag) CheckSQL() string {
	return `SELECT pg_backend_pid() p,current_setting('pgleader.owner',true) o,EXISTS(SELECT FROM pg_locks l WHERE ` + t.where() + ` AND l.pid=pg_backend_pid()) h,pg_is_in_recovery() r`
}

// SessionCheckSQL is CheckSQL without pg_locks, for a leader's paced
// renews: h is pg_try_advisory_xact_lock on the key, which the server
// answers from this backend's own lock table when the backend holds the
// lock (true, touching no shared memory: a hold the transaction's end gives
// back) and refuses when another session holds it or waits for it. It is
// also true when the lock is free with nobody waiting: a lock this session
// lost (its own unlock; a session's end changes p or o) and nobody else
// took. That case leaves no other leader, and CheckSQL, run at a tenure's
// start and every so many renews, catches it.
func (t Tag) SessionCheckSQL() string {
	args := fmt.Sprintf("%d", int64(t.ClassID)<<32|int64(t.ObjID))
	if t.ObjSubID == 2 {
		args = fmt.Sprintf("%d,%d", int32(t.ClassID), int32(t.ObjID))
	}
	return `SELECT pg_backend_pid() p,current_setting('pgleader.owner',true) o,pg_try_advisory_xact_lock(` + args + `) h,pg_is_in_recovery() r`
}

// HolderSQL returns the holder's application_name and pid (no row when the
// lock is free) and the session's own backend pid. It reads the sessions
// with pg_stat_get_activity, not the pg_stat_activity view, whose joins
// lock shared catalogs (pg_database, pg_authid): locks that cannot take
// the fast path, so a lock table another role filled would fail the
// lookup (SQLSTATE 53200); see the package doc.
func (t Tag) HolderSQL() string {
	return `SELECT coalesce(a.application_name,'') n,l.pid p,pg_backend_pid() b FROM pg_locks l LEFT JOIN pg_stat_get_activity(NULL) a ON a.pid=l.pid WHERE ` +
		t.where() + ` AND l.database=(SELECT datid FROM pg_stat_get_activity(pg_backend_pid())) LIMIT 1`
}

// AcquireSQL takes the lock with fn (pg_advisory_lock or
// pg_try_advisory_lock) unless the session's backend already holds it or
// the server is a standby, and never stacks a second acquisition on a held
// lock. It returns the backend pid, the session's owner token, whether the
// lock was already held, whether it is held now, and whether the server is
// in recovery. The lock call is an InitPlan in the CASE's ELSE branch,
// which PostgreSQL evaluates only when that branch is taken.
func (t Tag) AcquireSQL(fn string) string {
	call := "(SELECT true FROM " + fn + "(" + t.Args + "))"
	if fn == "pg_try_advisory_lock" {
		call = "(SELECT " + fn + "(" + t.Args + "))"
	}
	return `SELECT pg_backend_pid() p,current_setting('pgleader.owner',true) o,h.h,CASE WHEN h.r THEN false ELSE h.h OR ` + call + ` END a,h.r FROM(SELECT EXISTS(SELECT FROM pg_locks l WHERE ` + t.where() + ` AND l.pid=pg_backend_pid()) h,pg_is_in_recovery() r) h`
}

// Call returns "SELECT fn(args)" for an advisory-lock function.
func (t Tag) Call(fn string) string { return "SELECT " + fn + "(" + t.Args + ")" }

// Settings configure a session.
type Settings struct {
	Identity string // the candidate's identity
	// AppName is the session's application_name: Identity when empty (a
	// ranked candidate's carries its rank after Identity).
	AppName     string
	LockTimeout time.Duration // lock_timeout for every statement
	// Lease is idle_session_timeout (PostgreSQL 14+), tcp_user_timeout,
	// and about the span of the server's keepalive probing.
	Lease time.Duration
	// KeepIdle is the server's TCP keepalive idle time.
	KeepIdle time.Duration
}

// Session is a configured connection. PID and Token identify it: every
// statement checks that it runs on the same backend, and that the backend
// still carries this session's token (a custom setting, pgleader.owner).
// Behind a transaction-pooling proxy another client can land on the same
// backend and overwrite the token, which the next statement then sees.
type Session struct {
	PID   uint32
	Token string
	Major int // server major version
	// DeadlockTimeout is the server's deadlock_timeout: a lock wait that
	// lasts longer runs the deadlock detector, which takes every lock
	// partition. Quiet follower rounds stay below it.
	DeadlockTimeout time.Duration
	// Schemas are the schemas of the role's own search_path, before Setup
	// pinned it (see PinnedPath): where a table named without a schema
	// lives.
	Schemas []string
	// Direct: the server sees this connection's own TCP address and port
	// as its client's, so no proxy (a pooler included) stands between.
	// Otherwise Prove checks for a transaction pooler.
	Direct bool
}

// Same reports a pooling error unless pid and token are the session's.
func (s Session) Same(pid int32, token string) error {
	if uint32(pid) != s.PID {
		return fmt.Errorf("%w: backend pid changed from %d to %d between statements", ErrTransactionPooling, s.PID, pid)
	}
	if token != s.Token {
		return fmt.Errorf("%w: another client's session state appeared on this backend (pid %d)", ErrTransactionPooling, pid)
	}
	return nil
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// ServerMajor returns the server's major version from the startup
// parameters, with no round trip.
func ServerMajor(conn *pgx.Conn) int {
	v := conn.PgConn().ParameterStatus("server_version")
	if i := strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		v = v[:i]
	}
	n, _ := strconv.Atoi(v)
	return n
}

// MinMajor is the oldest PostgreSQL major version pgleader runs on: 14
// added idle_session_timeout, the server-side lease that frees a paused or
// partitioned leader's lock. Before it, nothing but the client's own
// clock would ever end such a leader's session behind a TCP proxy.
const MinMajor = 14

// ErrUnsupportedServer: the server is older than MinMajor.
var ErrUnsupportedServer = errors.New("pgleader: PostgreSQL 14 or later is required (before 14 there is no idle_session_timeout, so nothing would end a paused or partitioned leader's session, and its lock, behind a TCP proxy)")

// PinnedPath is the search_path of every session pgleader owns:
// pg_catalog first, so that no schema another role can create objects in
// may shadow a built-in function, operator, type or view (a role's
// search_path may put such a schema before pg_catalog), and pg_temp last,
// where the session's own functions live (always called by their
// qualified names).
const PinnedPath = "pg_catalog, pg_temp"

// pinSQL pins the session's search_path and returns the schemas the role's
// own search_path resolved to (as a JSON array), for the tables it names
// unqualified (see terms.Resolve). It runs before any other statement of
// the session, under the role's search_path, so it names pg_catalog for
// every call and uses no operator, type name, cast or relation.
const pinSQL = `SELECT pg_catalog.array_to_json(pg_catalog.current_schemas(false)), pg_catalog.set_config('search_path', '` + PinnedPath + `', false)`

// untimeSQL turns transaction_timeout (PostgreSQL 17 and later) off for
// the session, the running transaction included. Every name is
// qualified: it runs before the search_path is pinned.
const untimeSQL = `SELECT pg_catalog.set_config('transaction_timeout', '0', false)`

// Pin pins the search_path of a connection pgleader owns but does not set
// up as a lock session (an observer's, a resign request's, the CLI's) and
// returns the schemas of the role's own search_path.
func Pin(ctx context.Context, conn *pgx.Conn) ([]string, error) {
	res, err := execUnnamed(ctx, conn, [][]any{{pinSQL}})
	if err != nil {
		return nil, err
	}
	return pinned(res[0])
}

// pinned reads pinSQL's row.
func pinned(rows [][][]byte) ([]string, error) {
	if len(rows) != 1 || len(rows[0]) != 2 {
		return nil, errors.New("pgleader: no row from the search_path statement")
	}
	var schemas []string
	if err := json.Unmarshal(rows[0][0], &schemas); err != nil {
		return nil, fmt.Errorf("pgleader: the role's schemas: %w", err)
	}
	return schemas, nil
}

// execUnnamed runs statements in one round trip, each as an unnamed
// statement with text parameters and text results, whatever the
// connection's query mode, and returns each one's rows. The server parses
// each statement only after the one before it has run (pgx's cached modes
// would parse them all first), which Setup relies on.
func execUnnamed(ctx context.Context, conn *pgx.Conn, stmts [][]any) ([][][][]byte, error) {
	b := &pgconn.Batch{}
	for _, st := range stmts {
		params := make([][]byte, 0, len(st)-1)
		for _, v := range st[1:] {
			params = append(params, []byte(v.(string)))
		}
		b.ExecParams(st[0].(string), params, nil, nil, nil)
	}
	results, err := conn.PgConn().ExecBatch(ctx, b).ReadAll()
	if err != nil {
		return nil, err
	}
	out := make([][][][]byte, len(results))
	for i, r := range results {
		if r.Err != nil {
			return nil, r.Err
		}
		out[i] = r.Rows
	}
	if len(out) != len(stmts) {
		return nil, errors.New("pgleader: the server answered fewer statements than were sent")
	}
	return out, nil
}

// Setup configures the session in one round trip and returns it: first,
// on PostgreSQL 17 and later, transaction_timeout (off: see untimeSQL),
// then the search_path (see PinnedPath), then, in a statement the server
// parses only after that, the backend pid, whether the server is a
// standby, deadlock_timeout, and the settings. A server older than
// MinMajor gives ErrUnsupportedServer before anything is sent; a standby
// gives ErrStandby: nothing may be locked there.
func Setup(ctx context.Context, conn *pgx.Conn, s Settings) (Session, error) {
	var tok [8]byte
	rand.Read(tok[:])
	sess := Session{Major: ServerMajor(conn), Token: hex.EncodeToString(tok[:])}
	if sess.Major < MinMajor {
		return sess, fmt.Errorf("%w: the server is PostgreSQL %d", ErrUnsupportedServer, sess.Major)
	}
	sets := sessionSettings(s, sess)
	var sb strings.Builder
	sb.WriteString("SELECT pg_backend_pid(), pg_is_in_recovery(), (extract(epoch FROM current_setting('deadlock_timeout')::interval) * 1000)::int8, " +
		"host(inet_client_addr()), inet_client_port()")
	setup := []any{""}
	for i, kv := range sets {
		fmt.Fprintf(&sb, ", set_config('%s', $%d, false)", kv[0], i+1)
		setup = append(setup, kv[1])
	}
	setup[0] = sb.String()
	stmts := [][]any{{pinSQL}, setup}
	if sess.Major >= 17 {
		// First of all: the three statements are one transaction, and a
		// role's transaction_timeout ends the session if the transaction
		// outlasts it (on a starved server, a short one can); setting it
		// to 0 disarms the transaction's timer at once.
		stmts = append([][]any{{untimeSQL}}, stmts...)
	}
	res, err := execUnnamed(ctx, conn, stmts)
	if err != nil {
		return sess, err
	}
	res = res[len(res)-2:]
	if sess.Schemas, err = pinned(res[0]); err != nil {
		return sess, err
	}
	if len(res[1]) != 1 || len(res[1][0]) < 5 {
		return sess, errors.New("pgleader: no row from the session setup statement")
	}
	row := res[1][0]
	pid, err := strconv.ParseUint(string(row[0]), 10, 32)
	if err != nil {
		return sess, fmt.Errorf("pgleader: session setup: backend pid %q: %w", row[0], err)
	}
	deadlock, _ := strconv.ParseInt(string(row[2]), 10, 64)
	sess.PID, sess.DeadlockTimeout = uint32(pid), time.Duration(deadlock)*time.Millisecond
	sess.Direct = direct(conn, row[3], row[4])
	if string(row[1]) == "t" {
		return sess, fmt.Errorf("%w (session setup, backend pid %d)", ErrStandby, sess.PID)
	}
	return sess, nil
}

// sessionSettings are the settings Setup gives the session (set_config,
// for the session).
func sessionSettings(s Settings, sess Session) [][2]string {
	keepIdle := max(1, int(s.KeepIdle/time.Second))
	keepCount := max(1, int((s.Lease-time.Duration(keepIdle)*time.Second)/time.Second))
	sets := [][2]string{
		{"application_name", cmp.Or(s.AppName, s.Identity)},
		{"lock_timeout", ms(s.LockTimeout)},
		{"statement_timeout", "0"},
		{"idle_in_transaction_session_timeout", "0"},
		{"tcp_keepalives_idle", strconv.Itoa(keepIdle)},
		{"tcp_keepalives_interval", "1"},
		{"tcp_keepalives_count", strconv.Itoa(keepCount)},
		{"tcp_user_timeout", ms(s.Lease)},
		{"idle_session_timeout", ms(s.Lease)},
		{"pgleader.owner", sess.Token},
		// Nothing the session writes waits for a synchronous standby but
		// a fencing term, whose statement asks for it (durableSQL). Above
		// all not the drop of the session's temporary functions when it
		// ends, which commits under the session's setting: with the
		// standby gone, a session that ended (a crashed leader's) would
		// wait for it, holding its advisory locks, for as long.
		{"synchronous_commit", "local"},
	}
	if sess.Major >= 17 {
		// A role's or the server's transaction_timeout ends the session
		// of any transaction that lasts longer, a single statement's too:
		// an heir's lock wait would end its session every round.
		sets = append(sets, [2]string{"transaction_timeout", "0"})
	}
	return sets
}

// direct reports whether the server's view of its client (its address and
// port, NULL over a Unix socket) is this connection's own socket.
func direct(conn *pgx.Conn, addr, port []byte) bool {
	local, ok := conn.PgConn().Conn().LocalAddr().(*net.TCPAddr)
	if !ok || addr == nil || port == nil {
		return false
	}
	ip := net.ParseIP(string(addr))
	p, err := strconv.Atoi(string(port))
	return err == nil && ip != nil && ip.Equal(local.IP) && p == local.Port
}

// sharedBackend explains ErrTransactionPooling when Prove finds it.
const sharedBackend = "a second connection through the same connector landed on this session's backend"

// Prove checks, before anything is locked, that the session is its
// backend's only client: a pooler in transaction or statement mode (such as
// PgBouncer with pool_mode=transaction) hands an idle server connection to
// whichever client runs the next transaction, and loses session locks. A
// Direct session is proven already. Otherwise Prove opens a second
// connection with connect and reads its backend pid and the session token:
// a pooler in those modes gives the idle backend of this session to it (a
// pooler hands out the server connection used last), and then either
// matches: ErrTransactionPooling. A session pooler, or a plain TCP proxy,
// gives it another backend. The session's later statements keep checking
// their backend pid and token, so a pooler that hands this backend to
// another client later is still caught.
func Prove(ctx context.Context, sess Session, connect func(context.Context) (*pgx.Conn, error)) error {
	if sess.Direct || connect == nil {
		return nil
	}
	probe, err := connect(ctx)
	if err != nil {
		return fmt.Errorf("pgleader: a second connection to check for a pooler: %w", err)
	}
	defer Close(probe)
	res, err := execUnnamed(ctx, probe, [][]any{{`SELECT pg_catalog.pg_backend_pid(), pg_catalog.current_setting('pgleader.owner', true)`}})
	if err != nil {
		return Pooling(err)
	}
	if len(res[0]) != 1 || len(res[0][0]) != 2 {
		return errors.New("pgleader: no row from the pooler check")
	}
	row := res[0][0]
	if string(row[0]) == strconv.FormatUint(uint64(sess.PID), 10) || row[1] != nil && string(row[1]) == sess.Token {
		return fmt.Errorf("%w: %s (pid %d)", ErrTransactionPooling, sharedBackend, sess.PID)
	}
	return nil
}

// IsLockTimeout reports whether err is the server's lock_timeout
// (SQLSTATE 55P03, lock_not_available).
// IsServerError reports whether the server refused a statement (an ERROR,
// not a FATAL that ends the session): the session itself is fine.
func IsServerError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Severity == "ERROR"
}

func IsLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == LockNotAvailable
}

// Pooling reports whether err is a symptom of a transaction-pooling proxy,
// and wraps it as ErrTransactionPooling if so.
func Pooling(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == duplicatePreparedStatement || pgErr.Code == invalidSQLStatementName) {
		return fmt.Errorf("%w: prepared statements vanish or collide: %w", ErrTransactionPooling, err)
	}
	if errors.As(err, &pgErr) && (pgErr.Code == undefinedFunction && strings.Contains(pgErr.Message, "pg_temp.pgleader_") ||
		pgErr.Code == invalidSchemaName && strings.Contains(pgErr.Message, `"pg_temp"`)) {
		return fmt.Errorf("%w: this session's own function is missing, so the statement ran on another backend: %w", ErrTransactionPooling, err)
	}
	return err
}

// CheckResult reads a CheckSQL row: nil when the session's own backend
// holds the lock.
func CheckResult(row pgx.Row, sess Session) error {
	var gotPid int32
	var token *string
	var held, standby bool
	if err := row.Scan(&gotPid, &token, &held, &standby); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%w: %w", ErrRenewDeadline, err)
		}
		if perr := Pooling(err); perr != err {
			return perr
		}
		return fmt.Errorf("%w: %w", ErrConnectionLost, err)
	}
	if err := sess.Same(gotPid, deref(token)); err != nil {
		return err
	}
	if standby {
		return ErrStandby
	}
	if !held {
		return ErrLockLost
	}
	return nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Check asks whether the session's own backend holds the lock. ctx's
// deadline is the trust window: past it the error is ErrRenewDeadline.
func Check(ctx context.Context, conn *pgx.Conn, t Tag, sess Session) error {
	return CheckResult(conn.QueryRow(ctx, t.CheckSQL(), pgx.QueryExecModeExec), sess)
}

// AcquireResult reads an AcquireSQL row.
type AcquireResult struct {
	PID           int32
	Token         string
	Already, Held bool
	Standby       bool // the server is in recovery; nothing was locked
}

// ScanAcquire reads an AcquireSQL row. A standby gives ErrStandby.
func ScanAcquire(row pgx.Row) (AcquireResult, error) {
	var r AcquireResult
	var token *string
	err := row.Scan(&r.PID, &token, &r.Already, &r.Held, &r.Standby)
	r.Token = deref(token)
	if err == nil && r.Standby {
		err = ErrStandby
	}
	return r, err
}

// WaitIdle reads the idle connection until `until`, so that a server's
// FATAL message or a closed socket is seen at once. It returns nil at
// `until`, ctx's error when ctx ends first, and an error wrapping
// ErrConnectionLost when the connection ends.
func WaitIdle(ctx context.Context, conn *pgx.Conn, until time.Time) error {
	for {
		wctx, cancel := context.WithDeadline(ctx, until)
		_, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err == nil:
			continue // a notification: not ours, keep waiting
		case errors.Is(err, context.DeadlineExceeded):
			return nil
		default:
			return fmt.Errorf("%w: %w", ErrConnectionLost, err)
		}
	}
}

// Close closes a connection, bounded to a second.
func Close(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	conn.Close(ctx)
}

// Unlock releases the lock once. It fails when the lock was not held.
func Unlock(ctx context.Context, conn *pgx.Conn, t Tag) error {
	var ok bool
	if err := conn.QueryRow(ctx, t.Call("pg_advisory_unlock"), append([]any{pgx.QueryExecModeExec}, t.Vals...)...).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return ErrLockLost
	}
	return nil
}
