// Package pgtemp starts throwaway PostgreSQL servers, for the CLI's demo
// and bench, the examples and (through internal/testpg) the tests, and
// injects the faults they need: terminated backends, fast and immediate
// restarts, a streaming standby and its promotion, and a TCP proxy that
// cuts or black-holes connections. It does not import testing.
//
// It uses the system's initdb and postgres binaries: $PGLEADER_PG_BINDIR,
// then PATH, then /usr/lib/postgresql/*/bin (newest first). As root it runs
// them as the postgres OS user, because initdb refuses to run as root.
package pgtemp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/internal/harness/proc"
)

// BinDirEnv names the environment variable that points at a directory holding
// initdb and postgres.
const BinDirEnv = "PGLEADER_PG_BINDIR"

// HowToFix is appended to every start failure.
const HowToFix = "install the PostgreSQL server binaries (Debian/Ubuntu: apt-get install -y postgresql; " +
	"macOS: brew install postgresql@17, or Postgres.app) " +
	"or set " + BinDirEnv + " to the directory holding initdb and postgres"

// ErrNoServer is wrapped by every error that means no server could be started.
var ErrNoServer = errors.New("pgtemp: cannot start a throwaway PostgreSQL")

// Options tune a throwaway server. The zero value is fine.
type Options struct {
	// MaxConnections is max_connections (default 120).
	MaxConnections int
	// Settings are extra "name=value" server settings.
	Settings []string
	// Logf, when set, receives progress lines.
	Logf func(format string, args ...any)
	// BinDir is the directory of the server binaries; default: as
	// findBinDir finds them ($PGLEADER_PG_BINDIR first).
	BinDir string
}

// Server is a throwaway PostgreSQL cluster listening on a loopback port.
type Server struct {
	opts    Options
	bindir  string
	dir     string // temp dir; holds data/, the socket and the log
	port    int
	cred    *proc.Cred
	version int // server_version_num

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// Restart modes, as in pg_ctl -m.
const (
	Fast      = "fast"      // SIGINT: roll back transactions, disconnect clients, checkpoint
	Immediate = "immediate" // SIGQUIT: crash stop; the next start runs crash recovery
)

// New starts a throwaway server. Close stops it and removes its files.
func New(opts Options) (*Server, error) {
	if opts.MaxConnections == 0 {
		opts.MaxConnections = 120
	}
	bindir, err := opts.BinDir, error(nil)
	if bindir == "" {
		bindir, err = findBinDir()
	}
	if err != nil {
		return nil, err
	}
	s := &Server{opts: opts, bindir: bindir}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("%w: running as root, and initdb refuses root, but there is no postgres OS user to run it as (%w); %s", ErrNoServer, err, HowToFix)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &proc.Cred{UID: uint32(uid), GID: uint32(gid)}
	}
	if err := s.makeDir(); err != nil {
		return nil, err
	}
	if err := s.init(); err != nil {
		os.RemoveAll(s.dir)
		return nil, err
	}
	return s, s.startOnFreePort()
}

func (s *Server) makeDir() (err error) {
	if s.dir, err = os.MkdirTemp("", "pgleader-pg-"); err != nil {
		return fmt.Errorf("%w: %w", ErrNoServer, err)
	}
	if s.cred != nil {
		if err := os.Chown(s.dir, int(s.cred.UID), int(s.cred.GID)); err != nil {
			os.RemoveAll(s.dir)
			return fmt.Errorf("%w: chown %s: %w", ErrNoServer, s.dir, err)
		}
	}
	return nil
}

func (s *Server) startOnFreePort() error {
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		if s.port, lastErr = freePort(); lastErr != nil {
			continue
		}
		if lastErr = s.start(); lastErr == nil {
			return nil
		}
	}
	os.RemoveAll(s.dir)
	return lastErr
}

// NewStandby makes a streaming-replication standby of s and starts it on
// its own port. Promote turns it into a primary. Close it before s. It
// uses pg_basebackup, or, where the server's binaries lack it (the
// embedded-postgres builds of PostgreSQL 14 to 18 that CI's matrix uses),
// a base backup of its own: the same files, copied between
// pg_backup_start and pg_backup_stop on the local data directory, with
// WAL kept for the standby by a replication slot.
func (s *Server) NewStandby() (*Server, error) {
	st := &Server{opts: s.opts, bindir: s.bindir, cred: s.cred}
	if err := st.makeDir(); err != nil {
		return nil, err
	}
	data := filepath.Join(st.dir, "data")
	var err error
	if _, lerr := os.Stat(filepath.Join(s.bindir, "pg_basebackup")); lerr == nil {
		cmd := st.command("pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(s.port), "-U", "postgres",
			"-D", data, "-R", "-X", "stream", "--no-sync")
		if out, cerr := cmd.CombinedOutput(); cerr != nil {
			err = fmt.Errorf("pg_basebackup: %w\n%s", cerr, out)
		}
	} else {
		err = s.baseBackup(data, st.cred)
	}
	if err != nil {
		os.RemoveAll(st.dir)
		return nil, err
	}
	if err := st.startOnFreePort(); err != nil {
		return nil, err
	}
	return st, nil
}

// baseBackup copies s's data directory to dst as a standby's, without
// pg_basebackup: a non-exclusive backup on one session (pg_backup_start,
// the copy, pg_backup_stop, whose label becomes backup_label), a physical
// replication slot that keeps the WAL from the backup's start for the
// standby, and standby.signal with the connection settings pg_basebackup
// -R would write.
func (s *Server) baseBackup(dst string, cred *proc.Cred) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := s.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	slot := fmt.Sprintf("pgtemp_standby_%d", time.Now().UnixNano())
	start, stop := "SELECT pg_backup_start('pgtemp', true)", "SELECT labelfile FROM pg_backup_stop(false)"
	if s.version < 150000 {
		start, stop = "SELECT pg_start_backup('pgtemp', true, false)", "SELECT labelfile FROM pg_stop_backup(false, false)"
	}
	if _, err := conn.Exec(ctx, "SELECT pg_create_physical_replication_slot($1, true)", slot); err != nil {
		return fmt.Errorf("base backup: %w", err)
	}
	if _, err := conn.Exec(ctx, start); err != nil {
		return fmt.Errorf("base backup: %w", err)
	}
	src := filepath.Join(s.dir, "data")
	skip := map[string]bool{"postmaster.pid": true, "postmaster.opts": true, "backup_label": true, "tablespace_map": true}
	empty := map[string]bool{"pg_wal": true, "pg_replslot": true, "pg_stat_tmp": true, "pg_dynshmem": true, "pg_notify": true, "pg_serial": true, "pg_snapshots": true, "pg_subtrans": true}
	err = filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil // a file the server removed meanwhile: the WAL replays it
			}
			return err
		}
		rel, _ := filepath.Rel(src, path)
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			if err := os.MkdirAll(target, 0o700); err != nil {
				return err
			}
			if empty[rel] {
				return filepath.SkipDir
			}
			return nil
		case skip[rel] || !d.Type().IsRegular():
			return nil
		}
		b, err := os.ReadFile(path)
		if os.IsNotExist(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o600)
	})
	if err != nil {
		return fmt.Errorf("base backup: copy: %w", err)
	}
	var label string
	if err := conn.QueryRow(ctx, stop).Scan(&label); err != nil {
		return fmt.Errorf("base backup: %w", err)
	}
	conf := fmt.Sprintf("\nprimary_conninfo = 'host=127.0.0.1 port=%d user=postgres'\nprimary_slot_name = '%s'\n", s.port, slot)
	files := map[string]string{"backup_label": label, "standby.signal": ""}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dst, name), []byte(body), 0o600); err != nil {
			return err
		}
	}
	f, err := os.OpenFile(filepath.Join(dst, "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(conf); err != nil {
		f.Close()
		return err
	}
	f.Close()
	if cred != nil {
		return filepath.WalkDir(dst, func(path string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			return os.Chown(path, int(cred.UID), int(cred.GID))
		})
	}
	return nil
}

// Promote promotes a standby to a primary and waits until it accepts
// writes.
func (s *Server) Promote(ctx context.Context) error {
	conn, err := s.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_promote(true, 60)").Scan(&ok); err != nil || !ok {
		return fmt.Errorf("pg_promote: %v (ok=%v)", err, ok)
	}
	return nil
}

func findBinDir() (string, error) {
	has := func(dir string) bool {
		for _, b := range []string{"initdb", "postgres"} {
			if st, err := os.Stat(filepath.Join(dir, b)); err != nil || st.IsDir() {
				return false
			}
		}
		return true
	}
	if d := os.Getenv(BinDirEnv); d != "" {
		if has(d) {
			return d, nil
		}
		return "", fmt.Errorf("%w: %s=%s does not hold initdb and postgres; %s", ErrNoServer, BinDirEnv, d, HowToFix)
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil && has(filepath.Dir(real)) {
			return filepath.Dir(real), nil
		}
		if has(filepath.Dir(p)) {
			return filepath.Dir(p), nil
		}
	}
	// Debian's and Ubuntu's packages, then Homebrew's (Apple silicon, then
	// Intel) and Postgres.app's, newest first in each.
	for _, pattern := range []string{
		"/usr/lib/postgresql/*/bin",
		"/opt/homebrew/opt/postgresql@*/bin", "/usr/local/opt/postgresql@*/bin",
		"/opt/homebrew/opt/postgresql/bin", "/usr/local/opt/postgresql/bin",
		"/Applications/Postgres.app/Contents/Versions/*/bin",
	} {
		dirs, _ := filepath.Glob(pattern)
		sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
		for _, d := range dirs {
			if has(d) {
				return d, nil
			}
		}
	}
	return "", fmt.Errorf("%w: no initdb and postgres found on PATH, in /usr/lib/postgresql/*/bin, Homebrew or Postgres.app; %s", ErrNoServer, HowToFix)
}

// versionOf reads the major version from a binary directory's path: the
// number after the last "@" or in the parent directory's name
// (/usr/lib/postgresql/16/bin, .../postgresql@17/bin,
// .../Versions/16/bin); 0 when there is none.
func versionOf(bindir string) float64 {
	parent := filepath.Base(filepath.Dir(bindir))
	if i := strings.LastIndex(parent, "@"); i >= 0 {
		parent = parent[i+1:]
	}
	v, _ := strconv.ParseFloat(parent, 64)
	return v
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) logf(format string, args ...any) {
	if s.opts.Logf != nil {
		s.opts.Logf(format, args...)
	}
}

func (s *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bindir, name), args...)
	cmd.Dir = s.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "LANG=C")
	proc.Prepare(cmd, s.procOptions())
	return cmd
}

func (s *Server) init() error {
	cmd := s.command("initdb", "-D", filepath.Join(s.dir, "data"), "-U", "postgres",
		"--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%w: initdb failed: %w\n%s\n%s", ErrNoServer, err, strings.TrimSpace(string(out)), HowToFix)
	}
	// Members of the role PasswordRole log in with a password over TCP;
	// everyone else is trusted. Tests of authentication failures use it.
	hba := filepath.Join(s.dir, "data", "pg_hba.conf")
	b, err := os.ReadFile(hba)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNoServer, err)
	}
	b = append([]byte("host all +"+PasswordRole+" 127.0.0.1/32 scram-sha-256\n"), b...)
	if err := os.WriteFile(hba, b, 0o600); err != nil {
		return fmt.Errorf("%w: %w", ErrNoServer, err)
	}
	s.logf("pgtemp: initdb done in %s", s.dir)
	return nil
}

// PasswordRole names a group role that the throwaway server's pg_hba.conf
// makes log in with a password over TCP (scram-sha-256); every other role
// is trusted. A test creates it (NOLOGIN) and a LOGIN role IN ROLE it to
// test authentication failures.
const PasswordRole = "pgleader_password"

func (s *Server) start() error {
	logPath := filepath.Join(s.dir, "server.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNoServer, err)
	}
	defer logFile.Close()
	args := []string{"-D", filepath.Join(s.dir, "data"), "-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=" + s.dir,
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=" + strconv.Itoa(s.opts.MaxConnections),
		"-c", "shared_buffers=32MB",
		"-c", "log_min_messages=warning", "-c", "log_line_prefix=%m [%p] %a: ",
	}
	for _, kv := range s.opts.Settings {
		args = append(args, "-c", kv)
	}
	cmd := s.command("postgres", args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	release, err := proc.Start(cmd, s.procOptions())
	if err != nil {
		return fmt.Errorf("%w: start postgres: %w; %s", ErrNoServer, err, HowToFix)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); release(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()

	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, s.DSN())
		if err == nil {
			err = conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&s.version)
			conn.Close(ctx)
			cancel()
			if err == nil {
				s.logf("pgtemp: postgres %d ready on 127.0.0.1:%d", s.version, s.port)
				return nil
			}
		}
		cancel()
		select {
		case <-done:
			return fmt.Errorf("%w: postgres exited at start:\n%s", ErrNoServer, s.LogTail(20))
		default:
		}
		if time.Now().After(deadline) {
			s.signal(syscall.SIGKILL)
			<-done
			return fmt.Errorf("%w: postgres did not accept connections within 60s (last error: %w):\n%s", ErrNoServer, err, s.LogTail(20))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// LogTail returns the last n lines of the server log.
func (s *Server) LogTail(n int) string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// BinDir is the directory of the server binaries in use (pgbench is there
// too on most installations).
func (s *Server) BinDir() string { return s.bindir }

// LogLines counts the lines of the server log so far.
func (s *Server) LogLines() int {
	b, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
	return bytes.Count(b, []byte("\n"))
}

// LogLinesOf counts the server log's lines written by sessions whose
// application_name starts with prefix (the log line prefix names it),
// continuation lines (a CONTEXT's second line) included.
func (s *Server) LogLinesOf(prefix string) int {
	b, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
	n, theirs := 0, false
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" {
			continue
		}
		if line[0] != '\t' && line[0] != ' ' {
			// "<time> [<pid>] <application_name>: <message>"
			_, rest, _ := strings.Cut(line, "] ")
			theirs = strings.HasPrefix(rest, prefix)
		}
		if theirs {
			n++
		}
	}
	return n
}

// CPU is the CPU time the server's processes have used so far, in
// seconds: the postmaster's, its live children's and its exited
// children's (see proc.TreeCPU); -1 where /proc is missing.
func (s *Server) CPU() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return -1
	}
	return proc.TreeCPU(s.cmd.Process.Pid)
}

// Port returns the server's TCP port on 127.0.0.1.
func (s *Server) Port() int { return s.port }

// Addr returns "127.0.0.1:port".
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// VersionNum returns server_version_num, e.g. 150018.
func (s *Server) VersionNum() int { return s.version }

// DSN returns a connection string for the superuser postgres.
func (s *Server) DSN() string { return DSNFor(s.Addr()) }

// DSNFor returns a connection string for the superuser postgres at addr
// (host:port), for example a Proxy's address.
func DSNFor(addr string) string {
	return "postgres://postgres@" + addr + "/postgres?sslmode=disable&connect_timeout=10"
}

// procOptions: the server runs in its own process group (a terminal's ^C
// goes to the tests, which stop it in order), as the postgres user when
// this process is root, and gets SIGQUIT (an immediate stop) when this
// process ends.
func (s *Server) procOptions() proc.Options {
	return proc.Options{Group: true, DeathSignal: syscall.SIGQUIT, Cred: s.cred}
}

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Signal(sig)
	}
}

// Stop stops the server in the given mode (Fast or Immediate) and waits for
// it to exit. Start it again with StartAgain.
func (s *Server) Stop(mode string) error {
	sig := syscall.SIGINT
	if mode == Immediate {
		sig = syscall.SIGQUIT
	}
	s.mu.Lock()
	done := s.done
	s.mu.Unlock()
	if done == nil {
		return nil
	}
	s.signal(sig)
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		s.signal(syscall.SIGKILL)
		<-done
	}
	s.mu.Lock()
	s.cmd, s.done = nil, nil
	s.mu.Unlock()
	return nil
}

// StartAgain starts a stopped server on the same port and data directory,
// and returns once it accepts connections.
func (s *Server) StartAgain() error { return s.start() }

// Restart stops the server in the given mode and starts it again. It
// returns once the server accepts connections.
func (s *Server) Restart(mode string) error {
	if err := s.Stop(mode); err != nil {
		return err
	}
	return s.start()
}

// Close stops the server and removes its files.
func (s *Server) Close() {
	s.Stop(Fast)
	os.RemoveAll(s.dir)
}

// Connect opens a superuser connection to the server.
func (s *Server) Connect(ctx context.Context) (*pgx.Conn, error) {
	return pgx.Connect(ctx, s.DSN())
}

// Exec runs one statement on a fresh superuser connection.
func (s *Server) Exec(ctx context.Context, sql string, args ...any) error {
	conn, err := s.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql, args...)
	return err
}

// QueryInt runs a query that returns one integer, on a fresh superuser
// connection.
func (s *Server) QueryInt(ctx context.Context, sql string, args ...any) (int64, error) {
	conn, err := s.Connect(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	var n int64
	err = conn.QueryRow(ctx, sql, args...).Scan(&n)
	return n, err
}

// TerminateBackend runs pg_terminate_backend on every session named
// appName (its application_name, or appName and a ranked candidate's rank:
// "appName [N0 1.8.0]", see leader.Rank), waits until they are gone, and
// returns how many there were.
func (s *Server) TerminateBackend(ctx context.Context, appName string) (int, error) {
	named := `(application_name = $1 OR (starts_with(application_name, $1 || ' [') AND substr(application_name, length($1) + 1) ~ '^ \[[PNO]-?[0-9]+( [^ ]+)?\]$'))`
	q := `SELECT count(pg_terminate_backend(pid, 10000)) FROM pg_stat_activity WHERE ` + named + ` AND pid <> pg_backend_pid()`
	if s.version < 140000 {
		q = `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE ` + named + ` AND pid <> pg_backend_pid()`
	}
	n, err := s.QueryInt(ctx, q, appName)
	return int(n), err
}
