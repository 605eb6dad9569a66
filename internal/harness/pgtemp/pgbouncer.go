package pgtemp

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/pgleader/pgleader/internal/harness/proc"
)

// ErrNoPgBouncer is returned by StartPgBouncer when no pgbouncer binary is
// installed.
var ErrNoPgBouncer = errors.New("pgtemp: pgbouncer not found on PATH; install it (Debian/Ubuntu: apt-get install -y pgbouncer, which puts it in /usr/sbin; macOS: brew install pgbouncer)")

// PgBouncer is a throwaway PgBouncer in front of a Server.
type PgBouncer struct {
	port int
	cmd  *exec.Cmd
	done chan struct{}
	dir  string
}

// StartPgBouncer starts PgBouncer in front of s with the given pool_mode
// ("session", "transaction" or "statement") and default_pool_size. Close
// stops it.
func StartPgBouncer(s *Server, mode string, poolSize int) (*PgBouncer, error) {
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		return nil, ErrNoPgBouncer
	}
	dir, err := os.MkdirTemp("", "pgleader-pgbouncer-")
	if err != nil {
		return nil, err
	}
	if s.cred != nil {
		os.Chown(dir, int(s.cred.UID), int(s.cred.GID))
	}
	port, err := freePort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	users := filepath.Join(dir, "users.txt")
	os.WriteFile(users, []byte(`"postgres" ""`+"\n"), 0o644)
	ini := filepath.Join(dir, "pgbouncer.ini")
	os.WriteFile(ini, []byte(fmt.Sprintf(`[databases]
postgres = host=127.0.0.1 port=%d dbname=postgres user=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = %d
max_client_conn = 200
ignore_startup_parameters = extra_float_digits
logfile = %s
server_login_retry = 1
`, s.port, port, users, mode, poolSize, filepath.Join(dir, "pgbouncer.log"))), 0o644)
	cmd := exec.Command(bin, ini)
	out, _ := os.Create(filepath.Join(dir, "stderr.log"))
	cmd.Stdout, cmd.Stderr = out, out
	release, err := proc.Start(cmd, proc.Options{DeathSignal: syscall.SIGKILL, Cred: s.cred})
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtemp: start pgbouncer: %w", err)
	}
	b := &PgBouncer{port: port, cmd: cmd, done: make(chan struct{}), dir: dir}
	go func() { cmd.Wait(); release(); out.Close(); close(b.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", b.Addr(), time.Second)
		if err == nil {
			c.Close()
			return b, nil
		}
		select {
		case <-b.done:
			log, _ := os.ReadFile(filepath.Join(dir, "stderr.log"))
			log2, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgtemp: pgbouncer exited:\n%s\n%s", log, log2)
		default:
		}
		if time.Now().After(deadline) {
			b.Close()
			return nil, fmt.Errorf("pgtemp: pgbouncer not listening after 30s: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Close stops PgBouncer and removes its files.
func (b *PgBouncer) Close() {
	b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.done:
	case <-time.After(10 * time.Second):
		b.cmd.Process.Kill()
		<-b.done
	}
	os.RemoveAll(b.dir)
}

// Addr returns PgBouncer's "127.0.0.1:port".
func (b *PgBouncer) Addr() string { return "127.0.0.1:" + strconv.Itoa(b.port) }

// DSN returns a connection string through PgBouncer.
func (b *PgBouncer) DSN() string { return DSNFor(b.Addr()) }

// Log returns PgBouncer's log so far.
func (b *PgBouncer) Log() string {
	out, _ := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log"))
	return string(out)
}
