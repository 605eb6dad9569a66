// Command release rehearses a release of pgleader's modules and pins the
// nested modules to real versions of the modules they require.
//
//	go run ./tools/release rehearse   # CI: what a release would serve, proven with GOWORK=off
//	go run ./tools/release pin        # after a commit a nested module needs: require that commit
//	go run ./tools/release work       # go.work's replace directives to match the pinned requirements
//
// The repository holds several modules: the core (the root) and the
// nested ones (contrib/*, cmd/pgleader, examples, tools), each released
// with a path-prefixed tag (contrib/promleader/v0.2.0), as in
// opentelemetry-go-contrib. Their go.mod files never hold a replace
// directive: go.work joins them for development only. A nested module
// requires a real version of each module of this repository it imports:
// a released tag, or the pseudo-version of a commit already made (pin
// writes it, with its go.sum lines). See RELEASING.md.
//
// rehearse builds a file-system module proxy from the committed tree: every
// module zipped from HEAD (as a tag would serve it) at v0.0.0-rehearsal-<commit>,
// and every version of a repository module that a go.mod requires, zipped
// from its commit. Then, with GOWORK=off and that proxy first: every module
// builds, vets, and is tidy (go mod tidy -diff); a scratch module outside
// the tree gets each module alone and builds a program importing it; and
// go install .../cmd/pgleader@v0.0.0-rehearsal-<commit> installs a binary whose
// version command names that version.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

// rehearsal is the version the rehearsal serves HEAD's modules at:
// v0.0.0-rehearsal-<commit>, one per commit, so that the module cache never
// serves an earlier rehearsal's zip under the same version.
func rehearsal(root string) (string, error) {
	out, err := git(root, "rev-parse", "--short=12", "HEAD")
	if err != nil {
		return "", err
	}
	return "v0.0.0-rehearsal-" + strings.TrimSpace(out), nil
}

// Core is the core module's path.
const Core = "github.com/pgleader/pgleader"

// mod is one module of the repository.
type mod struct {
	Path string // module path
	Dir  string // directory, relative to the repository's root ("." for the core)
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: release rehearse | pin | work")
		os.Exit(2)
	}
	root, err := repoRoot()
	if err == nil {
		switch os.Args[1] {
		case "rehearse":
			err = rehearse(root)
		case "pin":
			err = pin(root)
		case "work":
			var ms []mod
			if ms, err = modules(root); err == nil {
				err = syncWork(root, ms, true)
			}
		default:
			err = fmt.Errorf("unknown command %q", os.Args[1])
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func repoRoot() (string, error) {
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", fmt.Errorf("not in a git checkout: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// modules lists the repository's modules at HEAD: every committed go.mod.
func modules(root string) ([]mod, error) {
	out, err := git(root, "ls-files", "--", "*go.mod", "go.mod")
	if err != nil {
		return nil, err
	}
	var ms []mod
	for _, f := range strings.Fields(out) {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return nil, err
		}
		mf, err := modfile.ParseLax(f, b, nil)
		if err != nil {
			return nil, err
		}
		ms = append(ms, mod{Path: mf.Module.Mod.Path, Dir: filepath.Dir(f)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Dir < ms[j].Dir })
	return ms, nil
}

func git(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, ee.Stderr)
		}
		return "", err
	}
	return string(out), nil
}

// proxy is a file-system module proxy (GOPROXY=file://dir).
type proxy struct{ dir string }

// add zips module m from the repository at rev (a commit), as version v.
func (p proxy) add(root string, m mod, rev, v string) error {
	esc, err := module.EscapePath(m.Path)
	if err != nil {
		return err
	}
	ev, err := module.EscapeVersion(v)
	if err != nil {
		return err
	}
	dir := filepath.Join(p.dir, esc, "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, ev+".zip")); err == nil {
		return nil // already there
	}
	sub := m.Dir
	if sub == "." {
		sub = ""
	}
	zf, err := os.Create(filepath.Join(dir, ev+".zip"))
	if err != nil {
		return err
	}
	if err := zip.CreateFromVCS(zf, module.Version{Path: m.Path, Version: v}, root, rev, sub); err != nil {
		zf.Close()
		return fmt.Errorf("zip %s@%s from %s: %w", m.Path, v, rev, err)
	}
	if err := zf.Close(); err != nil {
		return err
	}
	gomod, err := git(root, "show", rev+":"+filepath.ToSlash(filepath.Join(m.Dir, "go.mod")))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, ev+".mod"), []byte(gomod), 0o644); err != nil {
		return err
	}
	when, err := commitTime(root, rev)
	if err != nil {
		return err
	}
	info, _ := json.Marshal(map[string]any{"Version": v, "Time": when.Format(time.RFC3339)})
	if err := os.WriteFile(filepath.Join(dir, ev+".info"), info, 0o644); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, "list"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = fmt.Fprintln(f, v)
	return err
}

func commitTime(root, rev string) (time.Time, error) {
	out, err := git(root, "show", "-s", "--format=%ct", rev)
	if err != nil {
		return time.Time{}, err
	}
	var sec int64
	if _, err := fmt.Sscan(strings.TrimSpace(out), &sec); err != nil {
		return time.Time{}, err
	}
	return time.Unix(sec, 0).UTC(), nil
}

// pseudo is the pseudo-version of the commit rev (as the go command names
// an untagged commit of a module with no tag yet).
func pseudo(root, rev string) (string, error) {
	full, err := git(root, "rev-parse", rev)
	if err != nil {
		return "", err
	}
	when, err := commitTime(root, rev)
	if err != nil {
		return "", err
	}
	return module.PseudoVersion("v0", "", when, strings.TrimSpace(full)[:12]), nil
}

// requiredRepoVersions lists, for every module's go.mod at HEAD, the
// versions of repository modules it requires (path -> versions).
func requiredRepoVersions(root string, ms []mod) (map[string][]string, error) {
	ours := map[string]bool{}
	for _, m := range ms {
		ours[m.Path] = true
	}
	req := map[string][]string{}
	for _, m := range ms {
		b, err := os.ReadFile(filepath.Join(root, m.Dir, "go.mod"))
		if err != nil {
			return nil, err
		}
		mf, err := modfile.ParseLax("go.mod", b, nil)
		if err != nil {
			return nil, err
		}
		if len(mf.Replace) > 0 {
			return nil, fmt.Errorf("%s/go.mod has a replace directive: go install ...@version refuses it, and a dependent ignores it (use go.work for development)", m.Dir)
		}
		for _, r := range mf.Require {
			if ours[r.Mod.Path] {
				req[r.Mod.Path] = append(req[r.Mod.Path], r.Mod.Version)
			}
		}
	}
	return req, nil
}

// commitOf returns the commit a pseudo-version names.
func commitOf(root, v string) (string, error) {
	rev, err := module.PseudoVersionRev(v)
	if err != nil {
		return "", fmt.Errorf("%s is neither a pseudo-version of a commit nor a tag this repository has: %w", v, err)
	}
	full, err := git(root, "rev-parse", "--verify", rev+"^{commit}")
	if err != nil {
		return "", fmt.Errorf("pseudo-version %s names commit %s, which this repository does not have", v, rev)
	}
	return strings.TrimSpace(full), nil
}

// tagOf returns the tag a released version of m would have.
func tagOf(m mod, v string) string {
	if m.Dir == "." {
		return v
	}
	return filepath.ToSlash(m.Dir) + "/" + v
}

// build fills a proxy with every module at version v (from HEAD) and every
// repository version a go.mod requires.
func build(root, dir, v string) ([]mod, error) {
	ms, err := modules(root)
	if err != nil {
		return nil, err
	}
	p := proxy{dir: dir}
	for _, m := range ms {
		if err := p.add(root, m, "HEAD", v); err != nil {
			return nil, err
		}
	}
	req, err := requiredRepoVersions(root, ms)
	if err != nil {
		return nil, err
	}
	for _, m := range ms {
		for _, v := range req[m.Path] {
			rev := tagOf(m, v)
			if _, err := git(root, "rev-parse", "--verify", rev+"^{commit}"); err != nil {
				if rev, err = commitOf(root, v); err != nil {
					return nil, fmt.Errorf("%s@%s: %w", m.Path, v, err)
				}
			}
			if err := p.add(root, m, rev, v); err != nil {
				return nil, err
			}
		}
	}
	return ms, nil
}

// env is the environment of a go command against the proxy: GOWORK=off,
// the proxy first (other modules from the usual proxy), no checksum
// database for this repository's modules (the rehearsal's zips are not
// published).
func env(proxyDir string) []string {
	up := os.Getenv("GOPROXY")
	if up == "" || up == "off" {
		up = "https://proxy.golang.org,direct"
	}
	return append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "GOPROXY=file://"+proxyDir+","+up,
		"GONOSUMDB="+Core, "GONOSUMCHECK=1", "GOPRIVATE=", "GONOPROXY=")
}

func run(dir string, envv []string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir, cmd.Env = dir, envv
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s %s (in %s): %w\n%s", name, strings.Join(args, " "), dir, err, out.String())
	}
	return out.String(), nil
}

func rehearse(root string) error {
	work, err := os.MkdirTemp("", "pgleader-rehearsal-")
	if err != nil {
		return err
	}
	if os.Getenv("RELEASE_KEEP") == "" {
		defer os.RemoveAll(work)
	} else {
		fmt.Println("release: keeping", work)
	}
	proxyDir := filepath.Join(work, "proxy")
	Rehearsal, err := rehearsal(root)
	if err != nil {
		return err
	}
	ms, err := build(root, proxyDir, Rehearsal)
	if err != nil {
		return err
	}
	if err := syncWork(root, ms, false); err != nil {
		return err
	}
	e := env(proxyDir)
	step := func(format string, args ...any) { fmt.Printf("release: "+format+"\n", args...) }
	step("proxy of %d modules at %s, from HEAD (%s)", len(ms), Rehearsal, proxyDir)
	// Every module, alone, from a copy of the committed tree.
	tree := filepath.Join(work, "tree")
	if _, err := run(root, os.Environ(), "sh", "-c", "mkdir -p '"+tree+"' && git archive HEAD | tar -x -C '"+tree+"'"); err != nil {
		return err
	}
	os.Remove(filepath.Join(tree, "go.work"))
	os.Remove(filepath.Join(tree, "go.work.sum"))
	for _, m := range ms {
		dir := filepath.Join(tree, m.Dir)
		for _, args := range [][]string{{"build", "-o", os.DevNull, "./..."}, {"vet", "./..."}, {"mod", "tidy", "-diff"}} {
			if _, err := run(dir, e, "go", args...); err != nil {
				return err
			}
		}
		step("%-45s builds, vets and is tidy with GOWORK=off", m.Path)
	}
	// A user's module: each of ours alone, then a program that imports it.
	for _, m := range ms {
		if m.Path == Core+"/tools" {
			continue
		}
		pkgs, err := run(filepath.Join(tree, m.Dir), e, "go", "list", "-f", "{{if not .Standard}}{{.ImportPath}} {{.Name}}{{end}}", "./...")
		if err != nil {
			return err
		}
		scratch := filepath.Join(work, "user-"+strings.ReplaceAll(m.Dir, "/", "-"))
		if err := os.MkdirAll(scratch, 0o755); err != nil {
			return err
		}
		if _, err := run(scratch, e, "go", "mod", "init", "example.com/user"); err != nil {
			return err
		}
		if _, err := run(scratch, e, "go", "get", m.Path+"@"+Rehearsal); err != nil {
			return err
		}
		var imports []string
		sc := bufio.NewScanner(strings.NewReader(pkgs))
		for sc.Scan() {
			path, name, _ := strings.Cut(sc.Text(), " ")
			if name != "main" && !strings.Contains(path, "/internal/") {
				imports = append(imports, "\t_ "+fmt.Sprintf("%q", path))
			}
		}
		if len(imports) > 0 {
			src := "package main\n\nimport (\n" + strings.Join(imports, "\n") + "\n)\n\nfunc main() {}\n"
			if err := os.WriteFile(filepath.Join(scratch, "main.go"), []byte(src), 0o644); err != nil {
				return err
			}
			if _, err := run(scratch, e, "go", "mod", "tidy"); err != nil {
				return err
			}
			if _, err := run(scratch, e, "go", "build", "-o", os.DevNull, "."); err != nil {
				return err
			}
		}
		step("%-45s go get alone, and a program importing its %d packages builds", m.Path, len(imports))
	}
	// Every example, copied into a user's own module (its .go files but
	// the tests), builds there: no example reaches into this repository.
	examples, err := filepath.Glob(filepath.Join(tree, "examples", "*"))
	if err != nil {
		return err
	}
	for _, ex := range examples {
		srcs, _ := filepath.Glob(filepath.Join(ex, "*.go"))
		scratch := filepath.Join(work, "copy-"+filepath.Base(ex))
		n := 0
		for _, src := range srcs {
			if strings.HasSuffix(src, "_test.go") {
				continue
			}
			b, err := os.ReadFile(src)
			if err != nil {
				return err
			}
			if err := os.MkdirAll(scratch, 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(scratch, filepath.Base(src)), b, 0o644); err != nil {
				return err
			}
			n++
		}
		if n == 0 {
			continue
		}
		for _, args := range [][]string{{"mod", "init", "example.com/" + filepath.Base(ex)}, {"mod", "tidy"}, {"build", "-o", os.DevNull, "."}} {
			if _, err := run(scratch, e, "go", args...); err != nil {
				return err
			}
		}
		step("%-45s copied into a user's module, builds there", "examples/"+filepath.Base(ex))
	}
	// go install, as the README says.
	gobin := filepath.Join(work, "bin")
	ie := append(e, "GOBIN="+gobin)
	if _, err := run(work, ie, "go", "install", Core+"/cmd/pgleader@"+Rehearsal); err != nil {
		return err
	}
	out, err := run(work, ie, filepath.Join(gobin, "pgleader"), "version")
	if err != nil {
		return err
	}
	if !strings.Contains(out, Rehearsal) {
		return fmt.Errorf("pgleader version says %q, not %s", strings.TrimSpace(out), Rehearsal)
	}
	step("go install %s/cmd/pgleader@%s: %s", Core, Rehearsal, strings.TrimSpace(out))
	return nil
}

// pin makes every nested module require HEAD's commit of each repository
// module it imports (its pseudo-version), with go.sum lines to match, and
// drops replace directives; go.work then replaces those versions by their
// directories (syncWork), so that the workspace builds before the commit is
// public. Commit the result: its nested modules then resolve with
// GOWORK=off.
func pin(root string) error {
	if out, err := git(root, "status", "--porcelain", "--", "*go.mod", "*go.sum", "*.go"); err != nil || strings.TrimSpace(out) != "" {
		return fmt.Errorf("commit first: pin names HEAD's commit, and the tree has changes: %s%v", out, err)
	}
	work, err := os.MkdirTemp("", "pgleader-pin-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	ms, err := modules(root)
	if err != nil {
		return err
	}
	v, err := pseudo(root, "HEAD")
	if err != nil {
		return err
	}
	p := proxy{dir: filepath.Join(work, "proxy")}
	for _, m := range ms {
		if err := p.add(root, m, "HEAD", v); err != nil {
			return err
		}
	}
	ours := map[string]bool{}
	for _, m := range ms {
		ours[m.Path] = true
	}
	e := env(p.dir)
	for _, m := range ms {
		dir := filepath.Join(root, m.Dir)
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err != nil {
			return err
		}
		mf, err := modfile.Parse("go.mod", b, nil)
		if err != nil {
			return err
		}
		var args []string
		for _, r := range mf.Replace {
			if ours[r.Old.Path] {
				args = append(args, "-dropreplace="+r.Old.Path)
			}
		}
		for _, r := range mf.Require {
			if ours[r.Mod.Path] {
				args = append(args, "-require="+r.Mod.Path+"@"+v)
			}
		}
		if len(args) == 0 {
			continue
		}
		if _, err := run(dir, e, "go", append([]string{"mod", "edit"}, args...)...); err != nil {
			return err
		}
		if _, err := run(dir, e, "go", "mod", "tidy"); err != nil {
			return err
		}
		fmt.Printf("release: %s requires this repository's modules at %s\n", m.Path, v)
	}
	return syncWork(root, ms, true)
}
