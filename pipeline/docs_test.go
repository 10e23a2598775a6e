package pipeline_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/mirrorworker/mirrorworker/pacer"
)

func readDoc(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "docs", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestArchitectureIndexesEveryADR holds the ADR table of
// docs/architecture.md against the files of docs/adr/: every record is
// listed once, under its number and file name, and nothing else is.
func TestArchitectureIndexesEveryADR(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "docs", "adr", "[0-9][0-9][0-9][0-9]-*.md"))
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, f := range files {
		want = append(want, filepath.Base(f))
	}
	var got []string
	for _, m := range regexp.MustCompile(`(?m)^\| \[(\d{4})\]\(adr/(\d{4}-[^)]+\.md)\) \|`).FindAllStringSubmatch(readDoc(t, "architecture.md"), -1) {
		if !strings.HasPrefix(m[2], m[1]+"-") {
			t.Errorf("ADR row [%s] links to %s", m[1], m[2])
		}
		got = append(got, m[2])
	}
	if len(want) == 0 {
		t.Fatal("no ADR files found")
	}
	for _, f := range want {
		if n := strings.Count(strings.Join(got, "\n")+"\n", f+"\n"); n != 1 {
			t.Errorf("docs/architecture.md lists %s %d times, want once", f, n)
		}
	}
	for _, f := range got {
		if !slices.Contains(want, f) {
			t.Errorf("docs/architecture.md lists %s, which docs/adr/ does not have", f)
		}
	}
}

// TestArchitectureListsThePacerReasons holds the refusal reasons that
// docs/architecture.md names against pacer's Reason constants.
func TestArchitectureListsThePacerReasons(t *testing.T) {
	m := regexp.MustCompile(`Reason is ((?:Reason\w+(?: \| )?)+)`).FindStringSubmatch(readDoc(t, "architecture.md"))
	if m == nil {
		t.Fatal("docs/architecture.md has no line \"Reason is ReasonX | ...\"")
	}
	documented := strings.Split(m[1], " | ")
	code := map[string]pacer.Reason{
		"ReasonCooling": pacer.ReasonCooling, "ReasonProbing": pacer.ReasonProbing, "ReasonInFlight": pacer.ReasonInFlight,
		"ReasonSpacing": pacer.ReasonSpacing, "ReasonPaused": pacer.ReasonPaused, "ReasonBackoff": pacer.ReasonBackoff,
	}
	// Every Reason constant of pacer/api.go is in code (a new one must be
	// added here and to the document).
	src, err := os.ReadFile(filepath.Join("..", "pacer", "api.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range regexp.MustCompile(`(?m)^\s+(Reason\w+)\s+Reason = `).FindAllStringSubmatch(string(src), -1) {
		if _, ok := code[c[1]]; !ok {
			t.Errorf("pacer.%s is not known to this test", c[1])
		}
	}
	for name := range code {
		if !slices.Contains(documented, name) {
			t.Errorf("docs/architecture.md does not list pacer.%s", name)
		}
	}
	for _, d := range documented {
		if _, ok := code[d]; !ok {
			t.Errorf("docs/architecture.md lists %s, which pacer does not have", d)
		}
	}
}
