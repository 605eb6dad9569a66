package lockconn

import (
	"embed"
	"fmt"
	"path"
	"strings"
)

// The protocols' SQL lives in sql/*.sql, one file per protocol, each a list
// of named statements: a line "-- name: NAME" opens one, which runs to the
// next such line or the end of the file; its first comment lines document
// it and are not sent. Comments before the first name describe the file. sql_test.go renders every statement into
// testdata/statements.golden, so that a protocol change shows as an SQL
// diff in review.
//
//go:embed sql/*.sql
var sqlFiles embed.FS

// statements are the named statements, by file (without .sql) and name.
var statements = func() map[string]map[string]string {
	out := map[string]map[string]string{}
	entries, err := sqlFiles.ReadDir("sql")
	if err != nil {
		panic(err)
	}
	for _, e := range entries {
		b, err := sqlFiles.ReadFile(path.Join("sql", e.Name()))
		if err != nil {
			panic(err)
		}
		file := strings.TrimSuffix(e.Name(), ".sql")
		out[file] = parseStatements(string(b))
	}
	return out
}()

// parseStatements splits a file into its named statements.
func parseStatements(text string) map[string]string {
	out := map[string]string{}
	name := ""
	var body []string
	flush := func() {
		// The comment lines that open a statement document it; they are
		// not sent.
		for len(body) > 0 && (strings.HasPrefix(body[0], "--") || strings.TrimSpace(body[0]) == "") {
			body = body[1:]
		}
		if name != "" {
			out[name] = strings.TrimSpace(strings.Join(body, "\n"))
		}
	}
	for _, line := range strings.Split(text, "\n") {
		if n, ok := strings.CutPrefix(line, "-- name: "); ok {
			flush()
			name, body = strings.TrimSpace(n), nil
			continue
		}
		body = append(body, line)
	}
	flush()
	return out
}

// statement returns the statement name of sql/file.sql; a missing one is
// a bug the package's tests catch.
func statement(file, name string) string {
	s, ok := statements[file][name]
	if !ok {
		panic(fmt.Sprintf("lockconn: no statement %q in sql/%s.sql", name, file))
	}
	return s
}
