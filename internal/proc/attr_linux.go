package proc

import "syscall"

// kernelDeathSignal: Linux sends a child a signal of its choice when its
// parent ends (PR_SET_PDEATHSIG).
const kernelDeathSignal = true

func attr(o Options) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: o.Group}
	if !o.DeathToGroup {
		a.Pdeathsig = o.DeathSignal
	}
	credAttr(a, o.Cred)
	return a
}
