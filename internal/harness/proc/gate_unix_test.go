//go:build unix

package proc

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// A gated child runs its command only once the gate opens; when the
// supervisor's end of the gate closes first (the supervisor died before it
// armed the watchdog), the command never runs and the child exits 125.
func TestGate(t *testing.T) {
	dir := t.TempDir()
	for _, opened := range []bool{true, false} {
		mark := filepath.Join(dir, "ran")
		os.Remove(mark)
		cmd := exec.Command("touch", mark)
		open, shut, err := gate(cmd)
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if opened {
			open()
		} else {
			shut()
		}
		err = cmd.Wait()
		_, statErr := os.Stat(mark)
		var exit *exec.ExitError
		switch {
		case opened && (err != nil || statErr != nil):
			t.Fatalf("opened gate: %v; the command ran: %v", err, statErr == nil)
		case !opened && (!errors.As(err, &exit) || exit.ExitCode() != 125 || statErr == nil):
			t.Fatalf("shut gate: %v; the command ran: %v", err, statErr == nil)
		}
	}
}
