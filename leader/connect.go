package leader

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
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
// target_session_attrs=read-write work). It turns on client TCP keepalives
// and uses no named prepared statements. A string that does not parse gives
// a Connector whose Connect fails; ConnectorError reports it up front. The
// error never shows the password.
func DSN(dsn string) Connector {
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
}

func (c *dsnConnector) Connect(ctx context.Context) (*pgx.Conn, error) {
	if c.err != nil {
		return nil, c.err
	}
	return pgx.ConnectConfig(ctx, c.cfg)
}

var (
	urlPassword = regexp.MustCompile(`://[^:/@?#]*:([^@]*)@`)
	kvPassword  = regexp.MustCompile(`password\s*=\s*('(?:[^'\\]|\\.)*'|[^\s]+)`)
)

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
