package lockconn

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/statements.golden")

// exampleKey is a key for rendering statements: a bigint key or a pair.
type exampleKey struct {
	name    string
	c, o    uint32
	s       int16
	args    string
	argVals []any
}

func (k exampleKey) Name() string { return k.name }
func (k exampleKey) LockTag() (uint32, uint32, int16) {
	return k.c, k.o, k.s
}
func (k exampleKey) SQLArgs(first int) (string, []any) { return k.args, k.argVals }

// TestGoldenStatements renders every statement pgleader sends (the named
// ones of sql/*.sql, and those built for a key) into
// testdata/statements.golden: a protocol change shows as an SQL diff.
// Run with -update to accept one.
func TestGoldenStatements(t *testing.T) {
	var sb strings.Builder
	section := func(title, sql string) {
		fmt.Fprintf(&sb, "-- %s\n%s\n\n", title, strings.TrimSpace(sql))
	}
	files := make([]string, 0, len(statements))
	for f := range statements {
		files = append(files, f)
	}
	slices.Sort(files)
	for _, f := range files {
		names := make([]string, 0, len(statements[f]))
		for n := range statements[f] {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, n := range names {
			section(fmt.Sprintf("sql/%s.sql: %s", f, n), statements[f][n])
		}
	}
	for _, k := range []exampleKey{
		{name: "billing", c: 1599365894, o: 3389101757, s: 1, args: "$1::pg_catalog.int8"},
		{name: "", c: 7, o: 42, s: 2, args: "$1::pg_catalog.int4, $2::pg_catalog.int4"},
	} {
		tg := NewTarget(k, "", k.name, "me")
		what := fmt.Sprintf("key (%d, %d, %d)", k.c, k.o, k.s)
		section(what+": check", tg.checkSQL)
		section(what+": check, session only", tg.sessionSQL)
		section(what+": holder", tg.holderSQL)
		section(what+": acquire, waiting", tg.waitSQL)
		section(what+": acquire, trying", tg.trySQL)
		section(what+": unlock, quiet", tg.unlockSQL)
		section(what+": channels", strings.Join([]string{tg.Channel(), tg.ReserveChannel(), tg.ResignChannel()}, "\n"))
	}
	section("quiet: wait call", waitCall)
	section("quiet: poll call", pollCall)
	section("session: pin", pinSQL)
	section("lease: announce", notifySQL)
	got := sb.String()
	path := filepath.Join("testdata", "statements.golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./internal/wire/lockconn -run TestGoldenStatements -update to write it)", err)
	}
	if got != string(want) {
		t.Fatalf("the statements differ from %s: review the SQL diff, then run with -update:\n%s", path, firstDiff(string(want), got))
	}
}

// firstDiff shows where two texts first differ, line by line.
func firstDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < max(len(w), len(g)); i++ {
		var a, b string
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			b = g[i]
		}
		if a != b {
			return fmt.Sprintf("line %d:\n- %s\n+ %s", i+1, a, b)
		}
	}
	return ""
}

// Every file's statements parse, and none is empty.
func TestStatementsParse(t *testing.T) {
	for f, m := range statements {
		if len(m) == 0 {
			t.Errorf("sql/%s.sql has no named statement", f)
		}
		for n, s := range m {
			if s == "" || strings.HasPrefix(s, "--") {
				t.Errorf("sql/%s.sql: %s is empty or starts with a comment", f, n)
			}
		}
	}
	if !strings.Contains(statement("quiet", "functions"), fmt.Sprint(Space)) {
		t.Fatal("sql/quiet.sql does not use Space's value")
	}
}
