// Package layers_test checks that imports run one way: the library and its
// wire layer never import a harness (the test servers of internal/testpg,
// process supervision, the chaos and mutation harnesses), and the wire layer imports nothing of
// the library above it.
package layers_test

import (
	"go/build"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

const mod = "github.com/pgleader/pgleader/"

// The library's packages, and what each tier may import of this module.
var tiers = []struct {
	dirs      []string
	forbidden []string
}{
	// The library: never a harness.
	{[]string{"leader", "elector", "group", "lock", "health", "inspect", "slogcore"}, []string{"internal/harness/", "internal/testpg/"}},
	// The wire layer: no harness, and nothing of the library but leader's
	// vocabulary (which itself sits on the wire layer's errors).
	{[]string{"internal/wire/lockconn", "internal/wire/terms"}, []string{"internal/harness/", "internal/testpg/", "elector", "group", "lock", "health", "inspect", "leader"}},
	{[]string{"internal/wire/timing"}, []string{"internal/harness/", "internal/testpg/", "elector", "group", "lock", "health", "inspect"}},
}

func TestImportsRunOneWay(t *testing.T) {
	_, here, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(here), "..", "..")
	for _, tier := range tiers {
		for _, dir := range tier.dirs {
			pkg, err := build.ImportDir(filepath.Join(root, dir), 0)
			if err != nil {
				t.Fatalf("%s: %v", dir, err)
			}
			for _, imp := range pkg.Imports {
				rel, ok := strings.CutPrefix(imp, mod)
				if !ok {
					continue
				}
				for _, bad := range tier.forbidden {
					if rel == strings.TrimSuffix(bad, "/") || strings.HasPrefix(rel, bad) && strings.HasSuffix(bad, "/") {
						t.Errorf("%s imports %s", dir, imp)
					}
				}
			}
		}
	}
}
