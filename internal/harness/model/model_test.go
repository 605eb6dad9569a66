// Package model checks docs/model/quiet.pml, the quiet election's model,
// with spin: at most one candidate believes it leads, only while the
// server says it holds the key, and the key is always led again, whatever
// the crashes, resigns, reservations and lost notifications (see
// docs/model/README.md). It also checks that the model can fail: planted
// bugs in it must be found.
package model_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// check runs spin's exhaustive search (safety and, under weak fairness,
// acceptance cycles of the LTL claim) on model and returns its report.
func check(t *testing.T, model string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "m.pml"), []byte(model), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(name string, args ...string) string {
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil && name != "./pan" {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return string(out)
	}
	run("spin", "-a", "m.pml")
	run("gcc", "-O2", "-DNFAIR=5", "-DCOLLAPSE", "-w", "-o", "pan", "pan.c")
	return run("./pan", "-a", "-f", "-m3000000")
}

func model(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("spin"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("spin is not installed (CI installs it: apt-get install spin)")
		}
		t.Skip("spin is not installed (apt-get install spin); CI runs this test")
	}
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "model", "quiet.pml"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestQuietModel(t *testing.T) {
	out := check(t, model(t))
	if !strings.Contains(out, "errors: 0") || strings.Contains(out, "max search depth too small") {
		t.Fatalf("spin found a violation, or did not finish its search:\n%s", out)
	}
}

// The model is not vacuous: each planted bug is found.
func TestQuietModelFindsPlantedBugs(t *testing.T) {
	m := model(t)
	for _, bug := range []struct{ what, old, new string }{
		{"a watcher's poll never takes a free key", "       :: holder == NONE -> holder = i; won(i)", "       :: holder == NONE -> skip"},
		{"a release with no heir queued leaves the key held", "  :: else -> holder = NONE\n", "  :: else -> skip\n"},
		{"a winner keeps a key reserved for another for good", "  :: gate != NONE && gate != i -> release(); st[i] = watcher", "  :: gate != NONE && gate != i -> st[i] = watcher"},
		{"a crashed leader still believes it leads", "       if :: holder == i -> if :: leading[i] -> leading[i] = false; nlead-- :: else -> skip fi; release() :: else -> skip fi;", "       if :: holder == i -> release() :: else -> skip fi;"},
	} {
		if strings.Count(m, bug.old) != 1 {
			t.Fatalf("%s: the planted bug does not apply", bug.what)
		}
		if out := check(t, strings.Replace(m, bug.old, bug.new, 1)); strings.Contains(out, "errors: 0") {
			t.Errorf("%s: not found by the model", bug.what)
		}
	}
}
