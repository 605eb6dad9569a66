package lockconn

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/internal/wire/terms"
)

// MaxValue bounds a leader's value (see elector.Config.Value).
const MaxValue = 8 << 10

// ValueSQL reads t's holder and the value it proclaimed in the values table
// quoted (schema-qualified and quoted): one row when a session holds the
// lock, none when it is free. The value is NULL unless the table's row was
// written by the holder's own session: same backend pid, same session
// start, same identity; a row an earlier leader left (even one whose pid a
// new backend reuses) pairs with no later holder. The row is t's own (an
// Elector's), or the holder's member row (a group member's value, keyed by
// its member lock: see Member.ProclaimMember); t's own first. The row's
// table is checked too: trusted is whether its owner is the reader's role,
// one it is a member of, $1, or a superuser (NULL when no row paired). It
// runs on any connection, under any search_path: everything is named with
// its schema, and the owner is the one of the table the row came from
// (tableoid), whichever table the name found.
func (t Tag) ValueSQL(quoted string) string {
	eq := " OPERATOR(pg_catalog.=) "
	return `SELECT coalesce(a.application_name,''), l.pid, v.value,
  (SELECT pg_catalog.pg_has_role(c.relowner, 'MEMBER') OR pg_catalog.pg_get_userbyid(c.relowner)` + eq + `$1::pg_catalog.name
     OR EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.oid` + eq + `c.relowner AND r.rolsuper)
   FROM pg_catalog.pg_class c WHERE c.oid` + eq + `v.tableoid),
  (SELECT pg_catalog.pg_get_userbyid(c.relowner)::pg_catalog.text FROM pg_catalog.pg_class c WHERE c.oid` + eq + `v.tableoid)
FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_get_activity(NULL) a ON a.pid` + eq + `l.pid
LEFT JOIN ` + quoted + ` v ON (v.classid` + eq + `l.classid AND v.objid` + eq + `l.objid AND v.objsubid` + eq + `l.objsubid
    OR v.classid` + eq + fmt.Sprint(uint32(Space)) + ` AND v.objsubid` + eq + `2)
  AND v.backend_pid` + eq + `l.pid AND v.backend_start` + eq + `a.backend_start AND v.holder` + eq + `a.application_name
WHERE l.locktype` + eq + `'advisory' AND l.classid` + eq + fmt.Sprint(t.ClassID) + ` AND l.objid` + eq + fmt.Sprint(t.ObjID) +
		` AND l.objsubid` + eq + fmt.Sprint(t.ObjSubID) + ` AND l.granted AND l.mode` + eq + `'ExclusiveLock'
  AND l.database` + eq + `(SELECT datid FROM pg_catalog.pg_stat_get_activity(pg_catalog.pg_backend_pid()))
ORDER BY v.classid` + eq + `l.classid DESC NULLS LAST
LIMIT 1`
}

// Value is a key's leader and its value, as one read of the values table
// paired them (see ValueSQL).
type Value struct {
	// Holder is the holder's identity (its application_name), PID its
	// backend; both zero when Free.
	Holder string
	PID    int32
	// Value is what the holder proclaimed; nil when it has not (yet).
	Value []byte
	// Free: nobody holds the key.
	Free bool
}

// Querier runs a query: *pgx.Conn, a pool, a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// ReadValue runs a ValueSQL statement. A value from a table whose owner
// is not trusted (see ValueSQL) is refused with terms.ErrForeignTable: its
// owner could write any value for any leader.
func ReadValue(ctx context.Context, q Querier, sql, trustedOwner string) (Value, error) {
	rows, err := q.Query(ctx, sql, trustedOwner)
	if err != nil {
		return Value{}, err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return Value{}, err
		}
		return Value{Free: true}, nil
	}
	var v Value
	var trusted *bool
	var owner *string
	if err := rows.Scan(&v.Holder, &v.PID, &v.Value, &trusted, &owner); err != nil {
		return Value{}, err
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return Value{}, err
	}
	if v.Value != nil && (trusted == nil || !*trusted) {
		who := ""
		if owner != nil {
			who = *owner
		}
		return Value{}, fmt.Errorf("%w: the values table is owned by role %q, which this role is not a member of (its owner could write any value for any leader); drop it, or trust that role (TrustedOwner)", terms.ErrForeignTable, who)
	}
	return v, nil
}

// Proclaim writes value as t's leader's value, with proclaimSQL (see
// terms.ProclaimSQL), after proving in the same round trip that this
// session holds the lock, and announces it again on t's channel, so that
// followers and observers read the new value.
func (l *Lease) Proclaim(ctx context.Context, t *Target, proclaimSQL string, keyName string, value []byte) error {
	if value == nil {
		value = []byte{}
	}
	b := &pgx.Batch{}
	b.Queue(proclaimSQL, t.ClassID, t.ObjID, t.ObjSubID, keyName, value)
	b.Queue(notifySQL, t.Channel())
	err := l.checked(ctx, t, b, func(err error) error {
		if IsServerError(err) && !l.conn.IsClosed() {
			// The statement failed (a privilege, a lock wait the server
			// gave up on): the session and its lock are fine.
			return &ValueError{Err: err}
		}
		return nil
	})
	if err == nil {
		err = l.wake(ctx, t)
	}
	return err
}

// ValueError is a value the server refused to write (its *pgconn.PgError
// is Err); the session still holds its lock.
type ValueError struct{ Err error }

func (e *ValueError) Error() string { return "the leader's value was not written: " + e.Err.Error() }
func (e *ValueError) Unwrap() error { return e.Err }

// ReadValue reads t's leader and its value on the session (see ValueSQL),
// between rounds.
func (l *Lease) ReadValue(ctx context.Context, sql, trustedOwner string) (Value, error) {
	return ReadValue(ctx, l.conn, sql, trustedOwner)
}

// MemberValueTag is the values-table row of a group member (see
// ProclaimMember): its member lock's tag, as pg_locks shows it.
func MemberValueTag(group, identity string) (classid, objid uint32, objsubid int16) {
	return uint32(Space), uint32(MemberLock(group, identity)), 2
}

// EnsureValues finds (or, with opts.Create, creates) the values table for
// this member's session, as terms.EnsureValues does.
func (m *Member) EnsureValues(ctx context.Context, table string, opts terms.EnsureOptions) (terms.Table, error) {
	opts.Schemas = m.sess.Schemas
	return terms.EnsureValues(ctx, m.conn, table, opts)
}

// ProclaimMember writes value as this member's value, with proclaimSQL
// (terms.ProclaimSQL), in the row of its member lock: a reader of any key
// this session leads pairs it with the holder on the session's pid, start
// and identity (see ValueSQL). The row stays the member's across its
// sessions; a new session's write restamps it.
func (m *Member) ProclaimMember(ctx context.Context, proclaimSQL string, value []byte) error {
	if value == nil {
		value = []byte{}
	}
	c, o, s := MemberValueTag(m.group, m.identity)
	_, err := m.conn.Exec(ctx, proclaimSQL, c, o, s, "member "+m.identity+" of "+m.group, value)
	return err
}
