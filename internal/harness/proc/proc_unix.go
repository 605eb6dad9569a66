//go:build unix

package proc

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func credAttr(a *syscall.SysProcAttr, c *Cred) {
	if c != nil {
		a.Credential = &syscall.Credential{Uid: c.UID, Gid: c.GID}
	}
}

// Stop pauses p (SIGSTOP).
func Stop(p *os.Process) error { return Signal(p, syscall.SIGSTOP) }

// Cont resumes p (SIGCONT).
func Cont(p *os.Process) error { return Signal(p, syscall.SIGCONT) }

// KillGroup sends sig to the process group led by p (see Options.Group).
func KillGroup(p *os.Process, sig syscall.Signal) error {
	return syscall.Kill(-p.Pid, sig)
}

// Mono returns CLOCK_MONOTONIC in nanoseconds.
func Mono() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return ts.Nano()
}

// CPUTime is the user plus system CPU time this process has used.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// gate makes cmd wait, once started, until open is called: cmd runs as
// sh reading a line from a pipe (an extra file), then exec'ing the
// command (same pid, the pipe closed first). When this process ends
// before open, the pipe's write end closes and sh exits 125 without
// running the command. shut releases the pipe when cmd did not start.
func gate(cmd *exec.Cmd) (open, shut func(), err error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	fd := 3 + len(cmd.ExtraFiles)
	cmd.ExtraFiles = append(cmd.ExtraFiles, r)
	script := fmt.Sprintf(`read _ <&%d || exit 125; exec %d<&-; exec "$0" "$@"`, fd, fd)
	cmd.Args = append([]string{"/bin/sh", "-c", script, cmd.Path}, cmd.Args[1:]...)
	cmd.Path = "/bin/sh"
	shut = func() { r.Close(); w.Close() }
	open = func() {
		r.Close()
		w.Write([]byte("\n"))
		w.Close()
	}
	return open, shut, nil
}

// watchdog starts sh with the read end of a pipe on its stdin; this process
// keeps the write end, which the kernel closes when this process ends. It
// starts before the child: arm writes the child's pid down the pipe, and
// sh's second read returns when the pipe closes, and then it signals pid
// (its group, with group). The child waits at its gate (see gate) until
// it is armed, so no window is left in which it runs unwatched. The watchdog is in a process group
// of its own, so that a terminal's ^C does not end it before it has done
// its work.
func watchdog(group bool, sig syscall.Signal) (arm func(pid int), release func(), err error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	target := "$pid"
	if group {
		target = "-$pid"
	}
	cmd := exec.Command("/bin/sh", "-c", "read pid || exit 0; read _; kill -"+strconv.Itoa(int(sig))+" "+target+" 2>/dev/null")
	cmd.Stdin = r
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	r.Close()
	if err != nil {
		w.Close()
		return nil, nil, err
	}
	arm = func(pid int) { w.Write([]byte(strconv.Itoa(pid) + "\n")) }
	release = func() {
		cmd.Process.Kill()
		w.Close()
		cmd.Wait()
	}
	return arm, release, nil
}
