package jobs

import "testing"

func TestVersionAtLeast(t *testing.T) {
	for _, c := range []struct {
		v    string
		want bool
	}{
		{"2.10.0", true}, {"2.15.2", true}, {"v2.11.1", true}, {"3.0.0", true}, {"2.10.0-beta.1", true},
		{"2.9.25", false}, {"2.2.0", false}, {"1.99.99", false},
	} {
		if got := versionAtLeast(c.v, MinServerVersion); got != c.want {
			t.Errorf("versionAtLeast(%q, %q) = %v, want %v", c.v, MinServerVersion, got, c.want)
		}
	}
}
