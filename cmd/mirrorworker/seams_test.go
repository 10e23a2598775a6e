package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestOnlyMainReadsTheProcessEnvironment: main.go hands os.Getenv to run,
// and everything else reads the environment through the getenv it was
// given, so that a test (or an in-process run) sets a hook without setting
// the process's variables.
func TestOnlyMainReadsTheProcessEnvironment(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if name == "main.go" || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == "os" {
				switch sel.Sel.Name {
				case "Getenv", "LookupEnv", "Environ":
					t.Errorf("%s: os.%s: read the getenv run was given", fset.Position(sel.Pos()), sel.Sel.Name)
				}
			}
			return true
		})
	}
}
