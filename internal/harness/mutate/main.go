// Command mutate plants the bugs listed in mutants.go into a copy of the
// module, one at a time, runs the unit tests against each, and reports
// which bugs the suite kills and which survive. Developers run it by hand
// (all 127 take about 1.5 hours on 2 cores):
//
//	go run ./internal/harness/mutate                      # every mutant, unit packages
//	go run ./internal/harness/mutate -only drain-without-renew,trust-from-reply
//	go run ./internal/harness/mutate -chaos 60s           # survivors also face a chaos run
//	go run ./internal/harness/mutate -list
//	go run ./internal/harness/mutate -compile             # does every planted bug still build?
//
// It first runs the suite on the unmutated copy: a red baseline voids the
// run. Each mutant runs only the unit packages whose test binaries contain
// the package it changes: no other test can see it. A mutant is killed when any test fails (or the build breaks, which
// it reports as "stillborn": fix the mutant), and survives when all pass.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// unitPackages are the packages whose tests must kill every mutant (the
// workspace's go.work lets the copy test the metrics module too).
var unitPackages = []string{"./elector", "./group", "./leader", "./lock", "./health", "./internal/wire/lockconn", "./contrib/promleader"}

func main() {
	only := flag.String("only", "", "comma-separated mutant IDs (default: all)")
	chaos := flag.Duration("chaos", 0, "also run TestChaos this long against each survivor")
	list := flag.Bool("list", false, "list the mutants and exit")
	timeout := flag.Duration("timeout", 10*time.Minute, "bound on one test run")
	compile := flag.Bool("compile", false, "only build (and vet, as go test does) each mutant's package with its tests, running none: lists the planted bugs that no longer build")
	flag.Parse()
	if *list {
		for _, m := range mutants {
			fmt.Printf("%-30s %-32s %s\n", m.ID, m.File, m.Breaks)
		}
		return
	}
	var err error
	if *compile {
		err = compileAll(*only, *timeout)
	} else {
		err = run(*only, *chaos, *timeout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mutate:", err)
		os.Exit(1)
	}
}

// plant copies the module to a temporary directory (the caller removes
// it) and returns it with the chosen mutants, each checked to apply
// exactly once before anything runs.
func plant(only string) (work string, chosen []mutant, err error) {
	chosen = mutants
	if only != "" {
		want := map[string]bool{}
		for _, id := range strings.Split(only, ",") {
			want[strings.TrimSpace(id)] = true
		}
		chosen = nil
		for _, m := range mutants {
			if want[m.ID] {
				chosen = append(chosen, m)
				delete(want, m.ID)
			}
		}
		if len(want) > 0 {
			return "", nil, fmt.Errorf("unknown mutant IDs: %v", want)
		}
	}
	root, err := moduleRoot()
	if err != nil {
		return "", nil, err
	}
	if work, err = os.MkdirTemp("", "pgleader-mutate-"); err != nil {
		return "", nil, err
	}
	if err := copyTree(root, work); err != nil {
		os.RemoveAll(work)
		return "", nil, err
	}
	for _, m := range chosen {
		b, err := os.ReadFile(filepath.Join(work, m.File))
		if err == nil {
			if n := bytes.Count(b, []byte(m.Old)); n != 1 {
				err = fmt.Errorf("%q occurs %d times in %s, want once", m.Old, n, m.File)
			}
		}
		if err != nil {
			os.RemoveAll(work)
			return "", nil, fmt.Errorf("%s: %w", m.ID, err)
		}
	}
	return work, chosen, nil
}

// compileAll builds each mutant's package with its tests (and go test's
// vet), the mutant planted alone, and runs no test: a planted bug that no
// longer builds, because the code it quotes was reshaped around it, tests
// nothing, and a full run reports it only as it reaches it.
func compileAll(only string, timeout time.Duration) error {
	work, chosen, err := plant(only)
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	began, stillborn := time.Now(), 0
	for _, m := range chosen {
		path := filepath.Join(work, m.File)
		orig, _ := os.ReadFile(path)
		os.WriteFile(path, bytes.Replace(orig, []byte(m.Old), []byte(m.New), 1), 0o644)
		// Its own package, with its tests: a bug that builds there builds
		// in every package that imports it (the bugs change no API).
		// -exec true: the test binary is built, never run.
		own := "./" + filepath.ToSlash(ownDir(m.File))
		if out, ok := goTest(work, timeout, "-run", "^$", "-exec", "true", own); !ok {
			stillborn++
			fmt.Printf("%-30s stillborn  %s\n", m.ID, firstFailure(out))
		}
		os.WriteFile(path, orig, 0o644)
	}
	fmt.Printf("%d of %d planted bugs build (%s)\n", len(chosen)-stillborn, len(chosen), time.Since(began).Round(time.Second))
	if stillborn > 0 {
		return fmt.Errorf("%d planted bugs do not build: fix them", stillborn)
	}
	return nil
}

func run(only string, chaos, timeout time.Duration) error {
	work, chosen, err := plant(only)
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	began := time.Now()
	fmt.Printf("baseline: ")
	if out, ok := goTest(work, timeout, unitPackages...); !ok {
		return fmt.Errorf("the unmutated suite fails; fix it first:\n%s", tail(out, 40))
	}
	fmt.Printf("green (%s)\n\n%-30s %-9s %8s  %s\n", time.Since(began).Round(time.Second), "mutant", "result", "seconds", "killed by / breaks")
	killed, stillborn, survived := 0, 0, []mutant{}
	reach := reachers{}
	for _, m := range chosen {
		path := filepath.Join(work, m.File)
		orig, _ := os.ReadFile(path)
		os.WriteFile(path, bytes.Replace(orig, []byte(m.Old), []byte(m.New), 1), 0o644)
		t0 := time.Now()
		pkgs := reach.of(work, m.File)
		if p, ok := mutantPkgs[m.ID]; ok {
			pkgs = p
		}
		out, ok := goTestOwnFirst(work, timeout, m.File, pkgs)
		result, by := "SURVIVED", m.Breaks
		switch {
		case !ok && (strings.Contains(out, "[build failed]") || strings.Contains(out, "[setup failed]")):
			stillborn++
			result, by = "stillborn", firstFailure(out)
		case !ok:
			killed++
			result, by = "killed", firstFailure(out)
		case chaos > 0:
			cout, cok := goTest(work, timeout, "./internal/harness/chaos", "-run", "TestChaos$", "-chaos.duration", chaos.String(), "-chaos.seed", "1")
			if !cok {
				killed++
				result, by = "killed", "chaos: "+firstFailure(cout)
			}
		}
		if result == "SURVIVED" {
			survived = append(survived, m)
		}
		fmt.Printf("%-30s %-9s %8.0f  %s\n", m.ID, result, time.Since(t0).Seconds(), by)
		os.WriteFile(path, orig, 0o644)
	}
	planted := len(chosen) - stillborn
	fmt.Printf("\n%d of %d killed (%.0f%%) in %s", killed, planted, 100*float64(killed)/float64(max(1, planted)), time.Since(began).Round(time.Second))
	if stillborn > 0 {
		fmt.Printf("; %d stillborn (they do not build: fix them)", stillborn)
	}
	fmt.Println()
	for _, m := range survived {
		fmt.Printf("survivor %s: %s (%s)\n", m.ID, m.Breaks, m.File)
	}
	return nil
}

// reachers caches, per mutated package, the unit packages whose test
// binaries contain it: only those can see a bug planted in it (the
// others' results cannot change), so only those run.
type reachers map[string][]string

// of returns the unit packages whose tests (and their test imports) build
// file's package in; all of them when go list cannot tell.
func (r reachers) of(work, file string) []string {
	dir := "./" + filepath.ToSlash(ownDir(file))
	if pkgs, ok := r[dir]; ok {
		return pkgs
	}
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}}", dir)
	cmd.Dir = work
	out, err := cmd.Output()
	if err != nil {
		return unitPackages
	}
	target := strings.TrimSpace(string(out))
	var pkgs []string
	for _, p := range unitPackages {
		cmd := exec.Command("go", "list", "-test", "-deps", "-f", "{{.ImportPath}}", p)
		cmd.Dir = work
		deps, err := cmd.Output()
		if err != nil {
			return unitPackages
		}
		for _, d := range strings.Split(string(deps), "\n") {
			if d == target {
				pkgs = append(pkgs, p)
				break
			}
		}
	}
	if len(pkgs) == 0 {
		pkgs = unitPackages
	}
	r[dir] = pkgs
	return pkgs
}

// ownDir is the directory of the package file belongs to: its own for a
// Go file, its parent's for a file a package embeds from a subdirectory
// (internal/wire/lockconn/sql/quiet.sql belongs to lockconn).
func ownDir(file string) string {
	dir := filepath.Dir(file)
	if strings.HasSuffix(file, ".go") {
		return dir
	}
	return filepath.Dir(dir)
}

// goTestOwnFirst runs the tests of file's own package first, when it is
// one of pkgs, and the rest of pkgs only if those pass: a mutant its own
// package kills is killed without the slower packages' runs.
func goTestOwnFirst(work string, timeout time.Duration, file string, pkgs []string) (string, bool) {
	own := "./" + filepath.ToSlash(ownDir(file))
	var rest []string
	found, flags := false, false
	for _, p := range pkgs {
		switch {
		case strings.HasPrefix(p, "-"):
			flags = true
		case p == own:
			found = true
		default:
			rest = append(rest, p)
		}
	}
	if !found || flags || len(rest) == 0 {
		return goTest(work, timeout, pkgs...)
	}
	if out, ok := goTest(work, timeout, own); !ok {
		return out, false
	}
	return goTest(work, timeout, rest...)
}

// goTest runs go test in dir and reports its output and whether it passed.
func goTest(dir string, timeout time.Duration, args ...string) (string, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// The golden SQL tests are change detectors: every SQL mutant would
	// "fail" them. A planted bug must be caught by a test of behaviour.
	cmd := exec.CommandContext(ctx, "go", append([]string{"test", "-count=1", "-failfast", "-skip", "Golden"}, args...)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err == nil
}

// firstFailure names the first failing test in go test's output.
func firstFailure(out string) string {
	for _, line := range strings.Split(out, "\n") {
		if s := strings.TrimSpace(line); strings.HasPrefix(s, "--- FAIL:") || strings.HasPrefix(s, "panic:") ||
			strings.Contains(s, "[build failed]") {
			return strings.TrimPrefix(s, "--- FAIL: ")
		}
	}
	return strings.TrimSpace(tail(out, 1))
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("run it inside the pgleader module")
	}
	return filepath.Dir(gomod), nil
}

// copyTree copies the module's files (not .git) to dst.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
}
