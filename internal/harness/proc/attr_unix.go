//go:build unix && !linux

package proc

import "syscall"

// kernelDeathSignal: only Linux has a parent-death signal; elsewhere the
// watchdog does it.
const kernelDeathSignal = false

func attr(o Options) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: o.Group}
	credAttr(a, o.Cred)
	return a
}
