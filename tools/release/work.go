package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"golang.org/x/mod/modfile"
)

// workReplaces is what go.work must replace: each version of a repository
// module that a committed go.mod requires (a pin's pseudo-version, which no
// proxy serves before the commit is public), by its directory. Without it
// a fresh machine could not build the workspace: the go command reads the
// go.mod of every required version, even of a workspace module.
func workReplaces(root string, ms []mod) (map[modKey]string, error) {
	req, err := requiredRepoVersions(root, ms)
	if err != nil {
		return nil, err
	}
	want := map[modKey]string{}
	for _, m := range ms {
		for _, v := range req[m.Path] {
			want[modKey{m.Path, v}] = workDir(m.Dir)
		}
	}
	return want, nil
}

type modKey struct{ path, version string }

// syncWork makes go.work's replace directives for the repository's own
// modules exactly workReplaces (write), or reports how they differ.
func syncWork(root string, ms []mod, write bool) error {
	want, err := workReplaces(root, ms)
	if err != nil {
		return err
	}
	name := filepath.Join(root, "go.work")
	b, err := os.ReadFile(name)
	if err != nil {
		return err
	}
	wf, err := modfile.ParseWork("go.work", b, nil)
	if err != nil {
		return err
	}
	ours := map[string]bool{}
	for _, m := range ms {
		ours[m.Path] = true
	}
	have := map[modKey]string{}
	for _, r := range wf.Replace {
		if ours[r.Old.Path] {
			have[modKey{r.Old.Path, r.Old.Version}] = r.New.Path
		}
	}
	var diff []string
	for k, d := range want {
		if have[k] != d {
			diff = append(diff, fmt.Sprintf("%s %s => %s is missing", k.path, k.version, d))
		}
	}
	for k, d := range have {
		if _, ok := want[k]; !ok {
			diff = append(diff, fmt.Sprintf("%s %s => %s is stale", k.path, k.version, d))
		}
	}
	sort.Strings(diff)
	if len(diff) == 0 {
		return nil
	}
	if !write {
		return fmt.Errorf("go.work's replace directives do not match the pinned requirements (run go run ./tools/release pin): %v", diff)
	}
	for k := range have {
		if err := wf.DropReplace(k.path, k.version); err != nil {
			return err
		}
	}
	keys := make([]modKey, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].path < keys[j].path })
	for _, k := range keys {
		if err := wf.AddReplace(k.path, k.version, want[k], ""); err != nil {
			return err
		}
	}
	wf.Cleanup()
	return os.WriteFile(name, modfile.Format(wf.Syntax), 0o644)
}

// workDir is how go.work names a module's directory: "./" or "./dir".
func workDir(d string) string {
	if d = filepath.ToSlash(filepath.Clean(d)); d == "." {
		return "./"
	}
	return "./" + d
}
