package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// TestOriginTimedListsTheSerialProcessTests keeps the Makefile's
// ORIGIN_TIMED in step with this package: `make test` runs those tests
// last, alone, and every other test of the package beside the race run.
// A serial test that starts processes (it skips under -short) and is not
// listed would judge the origin's timing on cores the race run saturates;
// a listed name that is no serial test here would be skipped by nothing.
func TestOriginTimedListsTheSerialProcessTests(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join("..", "..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^ORIGIN_TIMED\s*:=\s*\^\(([^)]*)\)\$\$\s*$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("the Makefile has no line ORIGIN_TIMED := ^(Test...|Test...)$$")
	}
	listed := map[string]bool{}
	for _, n := range strings.Split(string(m[1]), "|") {
		listed[n] = true
	}

	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	serial := map[string]bool{} // serial test -> it starts processes
	for _, f := range files {
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv != nil || fd.Body == nil || !strings.HasPrefix(fd.Name.Name, "Test") || fd.Name.Name == "TestMain" {
				continue
			}
			calls := map[string]bool{}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				if c, ok := n.(*ast.CallExpr); ok {
					if s, ok := c.Fun.(*ast.SelectorExpr); ok {
						calls[s.Sel.Name] = true
					}
				}
				return true
			})
			if !calls["Parallel"] {
				serial[fd.Name.Name] = calls["Short"]
			}
		}
	}
	var missing, stray []string
	for n, processes := range serial {
		if processes && !listed[n] {
			missing = append(missing, n)
		}
	}
	for n := range listed {
		if _, ok := serial[n]; !ok {
			stray = append(stray, n)
		}
	}
	sort.Strings(missing)
	sort.Strings(stray)
	for _, n := range missing {
		t.Errorf("%s is serial and starts processes: add it to ORIGIN_TIMED in the Makefile, or call t.Parallel", n)
	}
	for _, n := range stray {
		t.Errorf("ORIGIN_TIMED names %s, which is no serial test of cmd/mirrorworker", n)
	}
}
