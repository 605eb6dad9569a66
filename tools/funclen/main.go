// Command funclen fails when a function of the library is 60 lines or
// longer (tests excepted): a function that long holds more than one idea,
// and the next person to change it will break the one they did not see.
//
//	go run ./tools/funclen [-max 59] DIR...
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	limit := flag.Int("max", 59, "the longest function allowed, in lines")
	flag.Parse()
	var long []string
	for _, dir := range flag.Args() {
		found, err := scan(dir, *limit)
		if err != nil {
			fmt.Fprintln(os.Stderr, "funclen:", err)
			os.Exit(1)
		}
		long = append(long, found...)
	}
	sort.Strings(long)
	for _, l := range long {
		fmt.Println(l)
	}
	if len(long) > 0 {
		fmt.Fprintf(os.Stderr, "funclen: %d functions longer than %d lines\n", len(long), *limit)
		os.Exit(1)
	}
}

// scan reports the functions of dir's non-test Go files (not descending
// into testdata) longer than limit lines.
func scan(dir string, limit int) ([]string, error) {
	var out []string
	fset := token.NewFileSet()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "testdata" || path != dir && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			fd, ok := n.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				return true
			}
			lines := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
			if lines > limit {
				out = append(out, fmt.Sprintf("%s:%d: %s is %d lines", path, fset.Position(fd.Pos()).Line, fd.Name.Name, lines))
			}
			return false
		})
		return nil
	})
	return out, err
}
