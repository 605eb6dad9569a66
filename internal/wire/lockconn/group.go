package lockconn

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgleader/pgleader/internal/wire/terms"
)

// A group member's main session: the wire layer of package group. One
// round trip per round renews every key the member leads: the check
// (this backend, its token, a primary) and one scan of pg_locks that
// proves the member's locks and reads the members (sql/group.sql). Keys
// are taken with try-locks only (never a wait), and released and taken in
// one round trip, the exchange. Every statement is prepared once per
// session: the session is dedicated, and every round checks its backend
// pid and token.

// ErrLockTableFull is the server's shared lock table running out (SQLSTATE
// 53200, out_of_memory: "You might need to increase
// max_locks_per_transaction"): another session may have filled it.
var ErrLockTableFull = errors.New("the server's lock table is full")

// IsLockTableFull reports whether err is the server's lock table running
// out (SQLSTATE 53200).
func IsLockTableFull(err error) bool {
	var pgErr *pgconn.PgError
	return errors.Is(err, ErrLockTableFull) || errors.As(err, &pgErr) && pgErr.Code == outOfMemory
}

// outOfMemory is SQLSTATE 53200: the shared lock table is full.
const outOfMemory = "53200"

// Member is a group member's main session.
type Member struct {
	conn               *pgx.Conn
	sess               Session
	group, identity    string
	roster             int32
	channel, myChannel string
	marker             string // the prepared marker (see GroupMarker)
	bump               string // the prepared term bump; "" without fencing
}

// NewMember wraps a session set up with Setup (and proven with Prove) as
// the member identity of group.
func NewMember(conn *pgx.Conn, sess Session, group, identity string) *Member {
	roster := GroupRoster(group)
	channel := GroupChannel(group)
	return &Member{conn: conn, sess: sess, group: group, identity: identity, roster: roster,
		channel: channel, myChannel: MemberChannel(group, identity)}
}

// GroupChannel is the NOTIFY channel of a group's messages.
func GroupChannel(group string) string {
	return fmt.Sprintf("pgleader.group.%d", uint32(GroupRoster(group)))
}

// MemberChannel is the NOTIFY channel of one member: a resign tells the
// member that gets the key there first.
func MemberChannel(group, identity string) string {
	return fmt.Sprintf("%s.%d", GroupChannel(group), uint32(MemberLock(group, identity)))
}

// PID is the member's backend pid.
func (m *Member) PID() uint32 { return m.sess.PID }

// Close ends the session, which frees every lock it holds.
func (m *Member) Close() { Close(m.conn) }

// Prepare prepares the statements of a round and an exchange, once per
// session: a round then costs the server no parse and no plan.
func (m *Member) Prepare(ctx context.Context) error {
	for _, name := range []string{"check", "scan", "sync_off", "unlock_int8", "unlock_pair", "notify", "try_lock"} {
		q := statement("group", name)
		if _, err := m.conn.Prepare(ctx, q, q); err != nil {
			return err
		}
	}
	return nil
}

// LockTable is the server's shared lock table as a session read its
// settings.
type LockTable struct{ PerTx, Conns, Prepared int }

// Capacity is about how many locks the table holds: max_locks_per_transaction
// × (max_connections + max_prepared_transactions).
func (lt LockTable) Capacity() int { return lt.PerTx * (lt.Conns + lt.Prepared) }

// LockTable reads the lock table's size. On a fresh session: a session
// whose statement failed cannot read it.
func (m *Member) LockTable(ctx context.Context) (LockTable, error) {
	var lt LockTable
	err := m.conn.QueryRow(ctx, statement("group", "capacity")).Scan(&lt.PerTx, &lt.Conns, &lt.Prepared)
	return lt, err
}

// EnsureTerms finds (or creates) the terms table and prepares the term
// bump. It returns the table as the role's search_path found it.
func (m *Member) EnsureTerms(ctx context.Context, table string, opts terms.EnsureOptions) (terms.Table, error) {
	opts.Schemas = m.sess.Schemas
	tbl, err := terms.Ensure(ctx, m.conn, table, opts)
	if err != nil {
		return tbl, err
	}
	m.bump = strings.Replace(statement("group", "bump"), "TERMS", tbl.Quoted(), 1)
	return tbl, nil
}

// SpaceHolder is a session that holds a lock of pgleader's space.
type SpaceHolder struct {
	PID       uint32
	Role, App string
	OwnRole   bool // a session of this session's login role
}

func (h SpaceHolder) String() string {
	if h.PID == 0 {
		return "a session no longer there"
	}
	return fmt.Sprintf("pid %d (role %q, application_name %q)", h.PID, h.Role, h.App)
}

// ExclusiveHolder looks up who holds the lock (Space, obj) exclusively:
// one read of pg_locks, made only when a try failed. A zero SpaceHolder: none.
func (m *Member) ExclusiveHolder(ctx context.Context, obj int32) (SpaceHolder, error) {
	var h SpaceHolder
	var pid int32
	err := m.conn.QueryRow(ctx, statement("group", "exclusive_holder"), uint32(Space), uint32(obj)).Scan(&pid, &h.Role, &h.App, &h.OwnRole)
	if errors.Is(err, pgx.ErrNoRows) {
		return SpaceHolder{}, nil
	}
	h.PID = uint32(pid)
	return h, err
}

// TakeMemberLock takes this member's own lock (one session per identity):
// false when another session holds it, whose holder is then returned.
// Like every statement of a member that takes a lock, it does nothing on
// a backend other than the session's own (ErrTransactionPooling) or on a
// standby (ErrStandby).
func (m *Member) TakeMemberLock(ctx context.Context) (bool, SpaceHolder, error) {
	var mine *bool
	var standby bool
	lock := MemberLock(m.group, m.identity)
	err := m.conn.QueryRow(ctx, statement("group", "member_lock"), Space, lock, int32(m.sess.PID), m.sess.Token).Scan(&mine, &standby)
	if err == nil {
		err = m.guarded(mine, standby)
	}
	if err != nil {
		return false, SpaceHolder{}, err
	}
	if *mine {
		return true, SpaceHolder{}, nil
	}
	h, err := m.ExclusiveHolder(ctx, lock)
	return false, h, err
}

// guarded says why a guarded statement (member_lock, join, leave) refused to run
// (its answer NULL): a standby, or a backend not the session's own.
func (m *Member) guarded(answer *bool, standby bool) error {
	switch {
	case standby:
		return ErrStandby
	case answer == nil:
		return fmt.Errorf("%w: the session's backend (pid %d) or its token is not this connection's", ErrTransactionPooling, m.sess.PID)
	}
	return nil
}

// Listen listens on the group's channel and this member's own.
func (m *Member) Listen(ctx context.Context) error {
	_, err := m.conn.Exec(ctx, "LISTEN "+pgx.Identifier{m.channel}.Sanitize()+"; LISTEN "+pgx.Identifier{m.myChannel}.Sanitize(),
		pgx.QueryExecModeSimpleProtocol)
	return err
}

// Join takes the roster lock in share mode, which makes this session a
// member, and tells the group; false when another session holds the
// roster exclusively (RosterHolder says who). A round that has not joined
// yet joins before its check, so the statement guards itself: nothing on a
// backend other than the session's own (ErrTransactionPooling) or on a
// standby (ErrStandby).
func (m *Member) Join(ctx context.Context) (bool, error) {
	var ok *bool
	var standby bool
	err := m.conn.QueryRow(ctx, statement("group", "join"), Space, m.roster, m.channel,
		EncodeGroup(GroupMessage{Kind: GroupJoined}), int32(m.sess.PID), m.sess.Token).Scan(&ok, &standby)
	if err == nil {
		err = m.guarded(ok, standby)
	}
	if err != nil {
		return false, err
	}
	return *ok, nil
}

// RosterHolder says who holds the roster lock exclusively.
func (m *Member) RosterHolder(ctx context.Context) (SpaceHolder, error) {
	return m.ExclusiveHolder(ctx, m.roster)
}

// Scan is what a full round read: this session's keys (proven held by its
// own backend), the members' names, and their main sessions' pids.
type Scan struct {
	Held    map[Tag3]bool
	Members []string
	PIDs    map[uint32]string
}

// Round is a full round: the check and, when scan is set, the scan, and
// the marker, in one round trip. Without the scan, the Scan returned is
// empty: the check alone proves the session (see docs/groups.md, "What a
// round proves").
func (m *Member) Round(ctx context.Context, marker string, scan bool) (Scan, error) {
	if err := m.setMarker(ctx, marker); err != nil {
		return Scan{}, err
	}
	b := &pgx.Batch{}
	b.Queue(statement("group", "check"))
	if scan {
		b.Queue(statement("group", "scan"), uint32(Space), uint32(m.roster))
	}
	b.Queue(m.marker)
	br := m.conn.SendBatch(ctx, b)
	defer br.Close()
	if !scan {
		if err := m.readCheck(br); err != nil {
			return Scan{}, err
		}
		return Scan{}, br.Close()
	}
	sc, err := m.readScan(br)
	if err != nil {
		return Scan{}, err
	}
	return sc, br.Close()
}

// ErrNotDirect is Ping's refusal on a session that is not Direct: a proxy
// stands between, and only a statement's pid and token prove the backend.
var ErrNotDirect = errors.New("pgleader: a quiet round needs a direct session (no proxy between)")

// Direct reports whether the session is Direct: the server sees this
// connection's own TCP address and port as its client's.
func (m *Member) Direct() bool { return m.sess.Direct }

// Ping is a full round without a statement, for a Direct session: a bare
// Sync message, which the backend answers with ReadyForQuery and no
// transaction. A statement's transaction ends with PostgreSQL walking
// every lock the session holds (LockReleaseAll, at each commit), which at
// 100,000 keys was most of what a standing group cost the server; a Sync
// runs no transaction, and proves what the check does (docs/groups.md,
// "What a round proves"): on a Direct session the backend that answers is
// the session's own, for as long as the connection lasts, no client but
// this one sends it anything, and a primary's backend never finds itself
// on a standby. The Sync also restarts the backend's idle_session_timeout,
// as a statement does. ctx's deadline bounds it; a backend that answers
// outside idle (none should) is an error.
func (m *Member) Ping(ctx context.Context) error {
	if !m.Direct() {
		return ErrNotDirect
	}
	pc := m.conn.PgConn()
	p := pc.StartPipeline(ctx)
	err := p.Sync()
	if err == nil {
		var res any
		if res, err = p.GetResults(); err == nil {
			if _, ok := res.(*pgconn.PipelineSync); !ok {
				err = fmt.Errorf("pgleader: a Sync answered with %T", res)
			}
		}
	}
	if cerr := p.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil && ctx.Err() != nil:
		return err
	case err != nil:
		return fmt.Errorf("%w: %w", ErrConnectionLost, err)
	case pc.TxStatus() != 'I':
		return fmt.Errorf("%w: the backend (pid %d) answered a Sync in transaction state %q, not idle", ErrConnectionLost, m.sess.PID, pc.TxStatus())
	}
	return nil
}

// setMarker prepares marker when it changed (the key count did).
func (m *Member) setMarker(ctx context.Context, marker string) error {
	if marker == m.marker {
		return nil
	}
	if _, err := m.conn.Prepare(ctx, marker, marker); err != nil {
		return err
	}
	if m.marker != "" {
		m.conn.Deallocate(ctx, m.marker)
	}
	m.marker = marker
	return nil
}

// readScan reads the check and the scan.
func (m *Member) readScan(br pgx.BatchResults) (Scan, error) {
	if err := m.readCheck(br); err != nil {
		return Scan{}, err
	}
	rows, err := br.Query()
	if err != nil {
		return Scan{}, err
	}
	defer rows.Close()
	sc := Scan{Held: map[Tag3]bool{}, PIDs: map[uint32]string{}}
	for rows.Next() {
		var own bool
		var t Tag3
		var member string
		var pid int32
		if err := rows.Scan(&own, &t.C, &t.O, &t.S, &member, &pid); err != nil {
			return Scan{}, err
		}
		if own {
			sc.Held[t] = true
		} else {
			sc.Members = append(sc.Members, member)
			sc.PIDs[uint32(pid)] = member
		}
	}
	if err := rows.Err(); err != nil {
		return Scan{}, err
	}
	slices.Sort(sc.Members)
	sc.Members = slices.Compact(sc.Members)
	return sc, nil
}

// readCheck reads the check's answer: the session's own backend, with its
// token, on a primary.
func (m *Member) readCheck(br pgx.BatchResults) error {
	var pid int32
	var token *string
	var standby bool
	if err := br.QueryRow().Scan(&pid, &token, &standby); err != nil {
		return Pooling(err)
	}
	if standby {
		return ErrStandby
	}
	tok := ""
	if token != nil {
		tok = *token
	}
	return m.sess.Same(pid, tok)
}

// Exchange is one exchange of locks: what to release, and tell, and what
// to take.
type Exchange struct {
	// Check sends the session check first, in the same round trip (a
	// light round, which read nothing before).
	Check bool
	// Unlock are released; then each of Successors is told on its recipient's
	// own channel (a resign, for the member that gets the key), and the
	// whole group is told that keys were released when Released is set.
	Unlock     []Tag3
	Successors []GroupMessage
	Released   bool
	// Want are tried, never waited for.
	Want   []Tag3
	Marker string
}

// Exchange releases and takes keys in one round trip. It returns the keys
// won, and whether the releases happened (session locks do not roll back
// with the batch's transaction, whatever fails after them). A full lock
// table while taking keys wraps ErrLockTableFull.
func (m *Member) Exchange(ctx context.Context, x Exchange) (won []Tag3, unlocked bool, err error) {
	b := &pgx.Batch{}
	pid, tok := int32(m.sess.PID), m.sess.Token
	if x.Check {
		b.Queue(statement("group", "check"))
	}
	b.Queue(statement("group", "sync_off"))
	nNotify := 0
	if len(x.Unlock) > 0 {
		i8, pa, pb := split(x.Unlock)
		b.Queue(statement("group", "unlock_int8"), pid, tok, i8)
		b.Queue(statement("group", "unlock_pair"), pid, tok, pa, pb)
		for _, r := range x.Successors {
			b.Queue(statement("group", "notify"), MemberChannel(m.group, r.To), EncodeGroup(r))
			nNotify++
		}
		if x.Released {
			b.Queue(statement("group", "notify"), m.channel, EncodeGroup(GroupMessage{Kind: GroupReleased}))
			nNotify++
		}
	}
	if len(x.Want) > 0 {
		i8, pa, pb := split(x.Want)
		b.Queue(statement("group", "try_lock"), pid, tok, i8, pa, pb)
	}
	if err := m.setMarker(ctx, x.Marker); err != nil {
		return nil, false, err
	}
	b.Queue(m.marker)
	br := m.conn.SendBatch(ctx, b)
	defer br.Close()
	if x.Check {
		if err := m.readCheck(br); err != nil {
			return nil, false, err
		}
	}
	if _, err := br.Exec(); err != nil {
		return nil, false, err
	}
	if len(x.Unlock) > 0 {
		for range 2 {
			if _, err := br.Exec(); err != nil {
				return nil, false, err
			}
		}
		unlocked = true
		for range nNotify {
			if _, err := br.Exec(); err != nil {
				return nil, true, err
			}
		}
	}
	if len(x.Want) > 0 {
		if won, err = readWon(br); err != nil {
			return nil, unlocked, err
		}
	}
	return won, unlocked, br.Close()
}

// readWon reads the keys a try_lock won.
func readWon(br pgx.BatchResults) ([]Tag3, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var won []Tag3
	for rows.Next() {
		var t Tag3
		if err := rows.Scan(&t.C, &t.O, &t.S); err != nil {
			return nil, err
		}
		won = append(won, t)
	}
	if err := rows.Err(); err != nil {
		if IsLockTableFull(err) {
			return nil, fmt.Errorf("%w: %w", ErrLockTableFull, err)
		}
		return nil, err
	}
	return won, nil
}

// split sorts keys into int8 keys and pair keys, as the lock functions take
// them.
func split(keys []Tag3) (i8 []int64, pa, pb []int32) {
	i8, pa, pb = []int64{}, []int32{}, []int32{}
	for _, k := range keys {
		if k.S == 1 {
			i8 = append(i8, int64(uint64(k.C)<<32|uint64(k.O)))
		} else {
			pa, pb = append(pa, int32(k.C)), append(pb, int32(k.O))
		}
	}
	return i8, pa, pb
}

// Bump installs the next term of each key won (names[i] names won[i]),
// in the table EnsureTerms found.
func (m *Member) Bump(ctx context.Context, won []Tag3, names []string) (map[Tag3]int64, error) {
	cs, os, ss := make([]uint32, len(won)), make([]uint32, len(won)), make([]int16, len(won))
	for i, k := range won {
		cs[i], os[i], ss[i] = k.C, k.O, k.S
	}
	b := &pgx.Batch{}
	b.Queue(durableSQL)
	b.Queue(m.bump, cs, os, ss, names, m.identity)
	br := m.conn.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[Tag3]int64{}
	for rows.Next() {
		var k Tag3
		var term int64
		if err := rows.Scan(&k.C, &k.O, &k.S, &term); err != nil {
			return nil, err
		}
		out[k] = term
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	// The commit comes after the rows: its wait for the standbys ends
	// with the batch.
	if err := br.Close(); err != nil {
		return nil, err
	}
	return out, durable(ctx)
}

// Broadcast tells the whole group msgs (resigns whose successors were told
// alone, off the hand-over's path; members the crash watch saw go).
func (m *Member) Broadcast(ctx context.Context, msgs []GroupMessage, marker string) error {
	if err := m.setMarker(ctx, marker); err != nil {
		return err
	}
	b := &pgx.Batch{}
	// A NOTIFY's transaction commits a record: no WAL flush to wait for
	// (see sync_off).
	b.Queue(statement("group", "sync_off"))
	for _, r := range msgs {
		b.Queue(statement("group", "notify"), m.channel, EncodeGroup(r))
	}
	b.Queue(m.marker)
	return m.conn.SendBatch(ctx, b).Close()
}

// Leave frees the member's every lock and tells the group it is gone; on
// a backend other than the session's own it frees and tells nothing
// (ErrTransactionPooling): the locks there are another client's.
func (m *Member) Leave(ctx context.Context) error {
	var left *bool
	err := m.conn.QueryRow(ctx, statement("group", "leave"), m.channel,
		EncodeGroup(GroupMessage{Kind: GroupGone, Member: m.identity}), int32(m.sess.PID), m.sess.Token).Scan(&left, new(string))
	if err == nil {
		err = m.guarded(left, false)
	}
	return err
}

// Wait reads the idle session until ctx ends: the next notification on
// the group's channels, or ctx's error, or ErrConnectionLost.
func (m *Member) Wait(ctx context.Context) (*pgconn.Notification, error) {
	n, err := m.conn.WaitForNotification(ctx)
	if err != nil && ctx.Err() == nil {
		return nil, fmt.Errorf("%w: %w", ErrConnectionLost, err)
	}
	return n, err
}

// IsGroupChannel reports whether a notification's channel is one of this
// member's (the group's, or its own).
func (m *Member) IsGroupChannel(channel string) bool {
	return channel == m.channel || channel == m.myChannel
}

// The marker. Every batch a member sends ends with a statement that names
// its group and the size of its key set, so that pg_stat_activity.query
// (the last statement of an idle backend) tells a DBA, and pgleader status,
// what the session is: `SELECT 'pgleader group v1 <name in hex> <keys>'`.
// The name is in hex so that no name can change the statement.
const markerPrefix = "pgleader group v1 "

// GroupMarker is the marker statement of a member of group with keys keys.
func GroupMarker(group string, keys int) string {
	return "SELECT '" + markerPrefix + hex.EncodeToString([]byte(group)) + " " + strconv.Itoa(keys) + "'"
}

// ParseGroupMarker reads a group member's pg_stat_activity.query: the
// group's name and its key count, and whether query is a marker at all.
func ParseGroupMarker(query string) (group string, keys int, ok bool) {
	rest, found := strings.CutPrefix(query, "SELECT '"+markerPrefix)
	if !found {
		return "", 0, false
	}
	rest, found = strings.CutSuffix(rest, "'")
	if !found {
		return "", 0, false
	}
	h, n, found := strings.Cut(rest, " ")
	if !found {
		return "", 0, false
	}
	name, err := hex.DecodeString(h)
	if err != nil {
		return "", 0, false
	}
	k, err := strconv.Atoi(n)
	if err != nil || k < 0 {
		return "", 0, false
	}
	return string(name), k, true
}

// WaitIdleUntil is Wait with a deadline.
func (m *Member) WaitIdleUntil(ctx context.Context, until time.Time) (*pgconn.Notification, error) {
	wctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	return m.Wait(wctx)
}

// Conn is the member's connection, for tests that do on it what no other
// session can (take one lock from a live member).
func (m *Member) Conn() *pgx.Conn { return m.conn }
