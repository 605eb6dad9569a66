// Package proc keeps the operating systems' differences in process
// supervision in one place, for the throwaway servers, the CLI's
// supervisor, demo and bench, and the tests' child processes:
//
//   - Start runs a child that must not outlive this process. On Linux the
//     kernel's parent-death signal does it for the child itself; a whole
//     process group (a supervised command with children of its own), or
//     any child on other Unix systems, gets a watchdog: a small sh process that holds
//     the read end of a pipe whose write end only this process holds, and
//     signals the child (or its whole group) when that pipe reaches end of
//     file, which the kernel causes when this process ends, however it
//     ends. Windows has neither; there the child is on its own (a Windows
//     job object would do it, and is not built).
//   - Stop and Cont pause and resume a process (SIGSTOP, SIGCONT), for the
//     fault injection of tests and the bench; Windows returns
//     errors.ErrUnsupported.
//   - Mono is CLOCK_MONOTONIC, which every process of a machine shares, so
//     that events of a child and its parent can be ordered.
//
// It imports nothing of the module and not "testing".
package proc

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
)

// Cred is a user and group to run a child as (Unix only; ignored on
// Windows).
type Cred struct{ UID, GID uint32 }

// Options describe a supervised child.
type Options struct {
	// Group puts the child in a process group of its own: signals sent with
	// KillGroup, and the watchdog's, reach all of it.
	Group bool
	// DeathSignal is sent to the child when this process ends; 0 for none.
	DeathSignal syscall.Signal
	// DeathToGroup sends DeathSignal to the child's whole process group
	// (with Group): a supervised command's own children too. It always
	// takes a watchdog.
	DeathToGroup bool
	// Cred runs the child as another user (this process must be root).
	Cred *Cred
}

// Start starts cmd as o describes. The returned release ends the watchdog,
// if there is one, without signalling the child; call it once the child
// has exited (or never: the watchdog then fires when this process ends,
// and the child is gone by then). cmd.SysProcAttr is replaced.
func Start(cmd *exec.Cmd, o Options) (release func(), err error) {
	cmd.SysProcAttr = attr(o)
	if o.DeathSignal == 0 || (kernelDeathSignal && !o.DeathToGroup) {
		return func() {}, cmd.Start()
	}
	arm, release, err := watchdog(o.Group && o.DeathToGroup, o.DeathSignal)
	if err != nil {
		return func() {}, err
	}
	open, shut, err := gate(cmd)
	if err != nil {
		release()
		return func() {}, err
	}
	if err := cmd.Start(); err != nil {
		shut()
		release()
		return func() {}, err
	}
	// The child waits at the gate until the watchdog knows its pid: a
	// SIGKILL of this process right after the start (under load, before
	// arm) then ends the child before it has run anything, instead of
	// leaving the command's own children unwatched.
	arm(cmd.Process.Pid)
	open()
	return release, nil
}

// Prepare sets cmd.SysProcAttr for a short-lived child run with Run or
// Output (no watchdog).
func Prepare(cmd *exec.Cmd, o Options) { cmd.SysProcAttr = attr(o) }

// ErrUnsupported is returned where the system has no equivalent.
var ErrUnsupported = errors.ErrUnsupported

// Signal sends sig to p, ignoring a process that has already exited.
func Signal(p *os.Process, sig os.Signal) error {
	err := p.Signal(sig)
	if errors.Is(err, os.ErrProcessDone) {
		return nil
	}
	return err
}
