package leader

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgleader/pgleader/internal/wire/lockconn"
)

// Connector opens a dedicated connection for holding a session advisory
// lock: an elector's, or TryRun's. It is called again after every
// connection loss and must return a new connection each time, never one
// borrowed from a pool (a pool would hand the session, and the lock, to
// other code).
type Connector interface {
	Connect(ctx context.Context) (*pgx.Conn, error)
}

// ConnectFunc adapts a function to Connector.
type ConnectFunc func(ctx context.Context) (*pgx.Conn, error)

// Connect calls f.
func (f ConnectFunc) Connect(ctx context.Context) (*pgx.Conn, error) { return f(ctx) }

// DSN returns a Connector for a PostgreSQL connection string (URL or
// key=value form, as pgx.ParseConfig takes it; multi-host strings with
// target_session_attrs=read-write work; a multi-host string without
// target_session_attrs gets target_session_attrs=primary, so that it finds
// the primary rather than the first standby). It turns on client TCP keepalives
// and uses no named prepared statements. A string that does not parse gives
// a Connector whose Connect fails; ConnectorError reports it up front. The
// error never shows the password. Logins the server rejects for good (bad
// credentials, no such database) give ErrRejected.
//
// An empty string is an error (elector.New reports it as a ConfigError)
// unless libpq's environment variables say where to connect (PGHOST,
// PGSERVICE or PGDATABASE): an unset $DATABASE_URL would otherwise
// connect to the local socket as the OS user and retry for ever.
func DSN(dsn string) Connector {
	if strings.TrimSpace(dsn) == "" && os.Getenv("PGHOST") == "" && os.Getenv("PGSERVICE") == "" && os.Getenv("PGDATABASE") == "" {
		return &dsnConnector{err: errors.New("empty connection string: is DATABASE_URL (or the variable your program reads it from) set? (libpq's PGHOST, PGSERVICE or PGDATABASE count too)")}
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return &dsnConnector{err: fmt.Errorf("invalid DSN: %s", redact(err.Error(), dsn))}
	}
	d := &net.Dialer{
		Timeout: 10 * time.Second,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable: true, Idle: 5 * time.Second, Interval: time.Second, Count: 3,
		},
	}
	cfg.DialFunc = d.DialContext
	// A multi-host string that names no target_session_attrs would stop at
	// the first host that answers, a standby included; an elector needs the
	// primary. One extra round trip per connection, only for such strings.
	if cfg.ValidateConnect == nil && hostCount(cfg) > 1 &&
		!strings.Contains(dsn, "target_session_attrs") && os.Getenv("PGTARGETSESSIONATTRS") == "" {
		cfg.ValidateConnect = pgconn.ValidateConnectTargetSessionAttrsPrimary
	}
	// No named prepared statements: the few lock queries are cheap to parse,
	// and the session stays usable (and its checks meaningful) behind a
	// pooler.
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	return &dsnConnector{cfg: cfg}
}

// ConnectorError returns the error of a Connector made by DSN from a string
// that does not parse, and nil otherwise.
func ConnectorError(c Connector) error {
	if d, ok := c.(*dsnConnector); ok {
		return d.err
	}
	return nil
}

type dsnConnector struct {
	cfg *pgx.ConnConfig
	err error
	// untimed holds, once a connection found PostgreSQL 17 or later, a
	// copy of cfg that turns transaction_timeout off in the startup
	// packet (see connect); refused, once a connection with it was
	// refused: never again.
	untimed atomic.Pointer[pgx.ConnConfig]
	refused atomic.Bool
}

func (c *dsnConnector) Connect(ctx context.Context) (*pgx.Conn, error) {
	if c.err != nil {
		return nil, c.err
	}
	conn, err := c.connect(ctx)
	err = tidyConnectError(err)
	var pgErr *pgconn.PgError
	if err != nil && errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "28P01", "28000", "3D000": // bad password or role, no hba entry, no such database
			return nil, fmt.Errorf("%w: %w", ErrRejected, err)
		}
	}
	if err != nil && errors.Is(err, pgconn.ErrStandbyConnection) {
		return nil, fmt.Errorf("%w: every host is a standby: %w", ErrStandby, err)
	}
	return conn, err
}

// connect opens a connection. A role's or the server's
// transaction_timeout (PostgreSQL 17 and later) ends the session of any
// transaction that lasts longer; a session's first statement turns it
// off (lockconn.Setup), but on a starved server even that statement can
// come too late. So once a connection has found a server that knows
// the setting, later ones (the reconnects after a lost session) turn it
// off in the startup packet, where it takes effect before any
// transaction. Not on the first connection: an older server refuses an
// unknown parameter there (a FATAL it logs), and so does a pooler that
// does not pass it on (PgBouncer, whatever the server behind it). A
// connection refused with it is asked again at once without it, and the
// Connector never sends it again.
func (c *dsnConnector) connect(ctx context.Context) (*pgx.Conn, error) {
	cfg := c.untimed.Load()
	if cfg == nil {
		conn, err := pgx.ConnectConfig(ctx, c.cfg)
		if err == nil && !c.refused.Load() && lockconn.ServerMajor(conn) >= 17 {
			c.untime()
		}
		return conn, err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	var pgErr *pgconn.PgError
	if err != nil && errors.As(err, &pgErr) {
		// The server or a pooler answered, and refused: 42704
		// (unrecognized configuration parameter) from PostgreSQL, 08P01
		// (unsupported startup parameter) from PgBouncer, or anything
		// else a pooler may say. A wrong password is asked once more too,
		// and fails the same.
		c.refused.Store(true)
		c.untimed.Store(nil)
		return pgx.ConnectConfig(ctx, c.cfg)
	}
	return conn, err
}

// untime has later connections turn transaction_timeout off in their
// startup packet.
func (c *dsnConnector) untime() {
	u := c.cfg.Copy()
	u.RuntimeParams["transaction_timeout"] = "0"
	c.untimed.CompareAndSwap(nil, u)
}

// tidyConnectError drops, from a failed connection's message, the line of
// a TLS attempt the server refused when pgx then tried the same host
// without TLS (sslmode=prefer, the default): that line came first and hid
// the reason (a wrong password). The error itself stays in the chain.
func tidyConnectError(err error) error {
	if err == nil {
		return nil
	}
	lines := strings.Split(err.Error(), "\n\t")
	if len(lines) < 3 {
		return err
	}
	const refused = "tls error: server refused TLS connection"
	kept := []string{lines[0]}
	for i, l := range lines[1:] {
		host, _, _ := strings.Cut(l, " ")
		next := ""
		if i+2 < len(lines) {
			next, _, _ = strings.Cut(lines[i+2], " ")
		}
		if strings.HasSuffix(l, refused) && next == host || l == kept[len(kept)-1] {
			continue // a refused TLS attempt before a plain one; or the same failure twice (prefer's two attempts)
		}
		kept = append(kept, l)
	}
	if len(kept) == len(lines) {
		return err
	}
	msg := strings.Join(kept, "\n\t")
	if len(kept) == 2 {
		msg = kept[0] + " " + kept[1]
	}
	return &tidyError{msg: msg, err: err}
}

// tidyError is an error with a clearer message; Unwrap gives the original.
type tidyError struct {
	msg string
	err error
}

func (e *tidyError) Error() string { return e.msg }
func (e *tidyError) Unwrap() error { return e.err }

// hostCount counts the distinct host:port pairs a parsed config tries.
func hostCount(cfg *pgx.ConnConfig) int {
	seen := map[string]bool{net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))): true}
	for _, f := range cfg.Fallbacks {
		seen[net.JoinHostPort(f.Host, strconv.Itoa(int(f.Port)))] = true
	}
	return len(seen)
}

var (
	urlPassword = regexp.MustCompile(`://[^:/@?#]*:([^@]*)@`)
	kvPassword  = regexp.MustCompile(`password\s*=\s*('(?:[^'\\]|\\.)*'|[^\s]+)`)
)

// RedactDSN returns a connection string with its password replaced by
// xxxxx, for printing: the URL form's (postgres://user:secret@host/db) and
// the key=value form's (password=secret).
func RedactDSN(dsn string) string { return redact(dsn, dsn) }

// redact removes from s every password the connection string dsn may hold.
func redact(s, dsn string) string {
	var secrets []string
	for _, m := range urlPassword.FindAllStringSubmatch(dsn, -1) {
		secrets = append(secrets, m[1])
	}
	for _, m := range kvPassword.FindAllStringSubmatch(dsn, -1) {
		secrets = append(secrets, m[1], strings.Trim(m[1], "'"))
	}
	for _, sec := range secrets {
		if sec != "" {
			s = strings.ReplaceAll(s, sec, "xxxxx")
		}
	}
	return s
}
