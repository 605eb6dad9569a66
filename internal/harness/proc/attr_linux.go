package proc

import "syscall"

// kernelDeathSignal: Linux sends a child a signal of its choice when its
// parent ends (PR_SET_PDEATHSIG).
const kernelDeathSignal = true

func attr(o Options) *syscall.SysProcAttr {
	// The child itself always gets the kernel's parent-death signal; with
	// DeathToGroup the watchdog also signals the rest of its group.
	a := &syscall.SysProcAttr{Setpgid: o.Group, Pdeathsig: o.DeathSignal}
	credAttr(a, o.Cred)
	return a
}
