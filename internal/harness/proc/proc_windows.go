package proc

import (
	"os"
	"os/exec"
	"syscall"
	"time"
)

const kernelDeathSignal = false

func attr(o Options) *syscall.SysProcAttr { return &syscall.SysProcAttr{} }

// watchdog: Windows has no equivalent here (a job object would be one).
func watchdog(bool, syscall.Signal) (func(int), func(), error) { return func(int) {}, func() {}, nil }

// gate does nothing on Windows (there is no watchdog to wait for).
func gate(*exec.Cmd) (func(), func(), error) { return func() {}, func() {}, nil }

// Stop is not supported on Windows.
func Stop(*os.Process) error { return ErrUnsupported }

// Cont is not supported on Windows.
func Cont(*os.Process) error { return ErrUnsupported }

// KillGroup kills p alone on Windows (no process groups here): every
// signal but os.Interrupt ends it.
func KillGroup(p *os.Process, sig syscall.Signal) error { return p.Kill() }

// Mono returns the wall clock on Windows, which every process shares too,
// with less resolution.
func Mono() int64 { return time.Now().UnixNano() }

// CPUTime is not measured on Windows (0).
func CPUTime() time.Duration { return 0 }
