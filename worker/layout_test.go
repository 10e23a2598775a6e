package worker

import (
	"bufio"
	"bytes"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// TestFilesStandOnEachOtherWithoutALoop holds the package's layout
// (docs/architecture.md, "worker"): its files refer to each other's
// definitions without a loop, so they can be read from the ground up, and
// only the loops' file and the *Worker methods above it name the Worker.
// The references are the type checker's, not a search for names.
func TestFilesStandOnEachOtherWithoutALoop(t *testing.T) {
	uses := fileReferences(t)
	// A loop is a file that reaches itself.
	for _, from := range slices.Sorted(maps.Keys(uses)) {
		seen := map[string]bool{}
		path := map[string]string{}
		stack := []string{from}
		for len(stack) > 0 && !seen[from] {
			f := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			for to := range uses[f] {
				if !seen[to] {
					seen[to], path[to] = true, f
					stack = append(stack, to)
				}
			}
		}
		if seen[from] {
			var loop []string // from's predecessors back to from: the loop, backwards
			for f := path[from]; f != from; f = path[f] {
				loop = append(loop, f)
			}
			last := path[from]
			slices.Reverse(loop)
			t.Errorf("%s reaches itself: %s -> %s -> %s (%s uses %s of it)", from, from, strings.Join(loop, " -> "), from, last, strings.Join(uses[last][from], ", "))
		}
	}
	top := []string{"worker.go", "partition.go", "status.go", "repace.go"}
	for f, to := range uses {
		if names := to["worker.go"]; !slices.Contains(top, f) && slices.Contains(names, "Worker") {
			t.Errorf("%s names the Worker: only the loops and the Worker's own methods may (%s)", f, strings.Join(top, ", "))
		}
	}
}

// fileReferences returns, per file of the package (tests left out), the
// other files whose package-level definitions, fields and methods it
// uses, with the names used.
func fileReferences(t *testing.T) map[string]map[string][]string {
	t.Helper()
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, f := range pkgs["worker"].Files {
		files = append(files, f)
	}
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: exportImporter(t, fset)}
	pkg, err := conf.Check("github.com/mirrorworker/mirrorworker/worker", fset, files, info)
	if err != nil {
		t.Fatal(err)
	}
	uses := map[string]map[string][]string{}
	for id, obj := range info.Uses {
		if obj.Pkg() != pkg || !obj.Pos().IsValid() {
			continue
		}
		from, to := filepath.Base(fset.Position(id.Pos()).Filename), filepath.Base(fset.Position(obj.Pos()).Filename)
		if from == to {
			continue
		}
		if uses[from] == nil {
			uses[from] = map[string][]string{}
		}
		if !slices.Contains(uses[from][to], obj.Name()) {
			uses[from][to] = append(uses[from][to], obj.Name())
			sort.Strings(uses[from][to])
		}
	}
	return uses
}

// exportImporter imports the package's dependencies from the compiler's
// export data, which `go list -export` builds (or finds in the build
// cache), instead of type-checking them all from source.
func exportImporter(t *testing.T, fset *token.FileSet) types.Importer {
	t.Helper()
	out, err := exec.Command("go", "list", "-export", "-deps", "-f", "{{.ImportPath}}={{.Export}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -export: %v", err)
	}
	export := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if path, file, ok := strings.Cut(sc.Text(), "="); ok && file != "" {
			export[path] = file
		}
	}
	return importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		if f, ok := export[path]; ok {
			return os.Open(f)
		}
		return nil, fs.ErrNotExist
	})
}
