package proc

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ParentPid is a process's parent, from /proc (0 when unknown, or on a
// system without /proc).
func ParentPid(pid int) int {
	f := stat(pid)
	if len(f) < 2 {
		return 0
	}
	pp, _ := strconv.Atoi(f[1])
	return pp
}

// stat returns the fields of /proc/PID/stat after the command name.
func stat(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		s = s[i+1:]
	}
	return strings.Fields(s)
}

// TreeCPU sums the CPU seconds (user and system, as the kernel accounts
// them) of a process and all its children, including the children that
// already exited (the root's cutime and cstime): a PostgreSQL server's own
// cost, from its postmaster's pid. -1 when unknown (no /proc).
func TreeCPU(root int) float64 {
	if root <= 0 {
		return -1
	}
	const hz = 100 // USER_HZ on Linux
	ticks := func(f []string, i int) float64 {
		if len(f) <= i {
			return 0
		}
		v, _ := strconv.ParseFloat(f[i], 64)
		return v
	}
	// After the ")": state=0 ppid=1 ... utime=11 stime=12 cutime=13 cstime=14.
	pm := stat(root)
	if pm == nil {
		return -1
	}
	total := ticks(pm, 11) + ticks(pm, 12) + ticks(pm, 13) + ticks(pm, 14)
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == root {
			continue
		}
		if f := stat(pid); len(f) > 14 && f[1] == strconv.Itoa(root) {
			total += ticks(f, 11) + ticks(f, 12)
		}
	}
	return total / hz
}
