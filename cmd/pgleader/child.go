package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"
)

// runChild runs argv with the terminal's stdio until it exits. Signals
// pgleader receives (SIGINT, SIGTERM, SIGHUP) are passed on. When ctx ends
// first, the child gets SIGTERM and, after grace, SIGKILL. It returns the
// child's exit code (128+signal when a signal killed it).
func runChild(ctx context.Context, argv []string, grace time.Duration) (int, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// Its own process group, so signals reach the whole command; and it dies
	// with pgleader, so a killed supervisor never leaves an active behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return 127, err
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	kill := func(sig syscall.Signal) { syscall.Kill(-cmd.Process.Pid, sig) } // the whole process group
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
