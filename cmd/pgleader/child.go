package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/pgleader/pgleader/internal/harness/proc"
)

// runChild runs argv with the terminal's stdio until it exits. Signals
// pgleader receives (SIGINT, SIGTERM, SIGHUP) are passed on. When ctx ends
// first, the child gets SIGTERM and, after grace, SIGKILL. It returns the
// child's exit code (128+signal when a signal killed it). env is added to
// pgleader's own environment.
func runChild(ctx context.Context, argv []string, grace time.Duration, env ...string) (int, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// Its own process group, so signals reach the whole command; and the
	// whole group dies with pgleader (a watchdog sees to it; see
	// proc.Start), so a killed supervisor never leaves an active command,
	// or a child of one, behind.
	release, err := proc.Start(cmd, proc.Options{Group: true, DeathSignal: syscall.SIGKILL, DeathToGroup: true})
	if err != nil {
		return 127, err
	}
	defer release()
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	kill := func(sig syscall.Signal) { proc.KillGroup(cmd.Process, sig) } // the whole process group
	var killTimer <-chan time.Time
	ctxDone := ctx.Done()
	for {
		select {
		case err := <-done:
			return exitStatus(err), nil
		case s := <-sigs:
			kill(s.(syscall.Signal))
		case <-ctxDone:
			ctxDone = nil
			kill(syscall.SIGTERM)
			killTimer = time.After(grace)
		case <-killTimer:
			kill(syscall.SIGKILL)
		}
	}
}

func exitStatus(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return 1
}
