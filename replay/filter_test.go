package replay

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/mirrorworker/mirrorworker/authority"
)

func TestParseAuthority(t *testing.T) {
	tests := []struct {
		in      string
		want    string // Authority.String()
		wantKey string
		wantErr string
	}{
		{in: "https://files.example.org/pkg/a.tgz", want: "files.example.org:443", wantKey: "files_example_org_443"},
		{in: "http://Files.Example.org./", want: "files.example.org:80", wantKey: "files_example_org_80"},
		{in: "https://files.example.org:8443/x", want: "files.example.org:8443", wantKey: "files_example_org_8443"},
		{in: "files.example.org:443", want: "files.example.org:443", wantKey: "files_example_org_443"},
		{in: "127.0.0.1:8080", want: "127.0.0.1:8080", wantKey: "127_0_0_1_8080"},
		{in: "[2001:db8::1]:8080", want: "[2001:db8::1]:8080", wantKey: "_2001_db8__1__8080"},
		{in: "bücher.example:443", want: "xn--bcher-kva.example:443", wantKey: "xn--bcher-kva_example_443"},
		{in: "files.example.org", wantErr: "give a URL (https://host/...) or host:port"},
		{in: ":443", wantErr: "give a URL"},
		{in: "files.example.org:", wantErr: "give a URL"},
		{in: "files.example.org:0", wantErr: "invalid authority"},
		{in: "files.example.org:99999", wantErr: "invalid authority"},
		{in: "ftp://files.example.org/", wantErr: "is not http or https"},
		{in: "", wantErr: "give a URL"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			a, err := ParseAuthority(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseAuthority = %v, %v; want an error containing %q", a, err, tt.wantErr)
				}
				if !errors.Is(err, ErrFilter) {
					t.Errorf("error %v does not wrap ErrFilter", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseAuthority: %v", err)
			}
			if a.String() != tt.want || a.Key() != tt.wantKey {
				t.Errorf("ParseAuthority = %s (key %s), want %s (key %s)", a, a.Key(), tt.want, tt.wantKey)
			}
		})
	}
}

func TestFilterSubjects(t *testing.T) {
	a := mustAuthority(t, "https://a.example/")
	b := mustAuthority(t, "b.example:8080")
	aAgain := mustAuthority(t, "https://A.EXAMPLE:443/other")
	tests := []struct {
		name    string
		f       Filter
		want    []string
		wantErr string
	}{
		{name: "everything", f: Filter{}, want: []string{"mirror.jobs.>"}},
		{name: "one tenant", f: Filter{Tenants: []string{"acme"}}, want: []string{"mirror.jobs.acme.*", "mirror.jobs.acme.*.*"}},
		{name: "one authority", f: Filter{Authorities: []authority.Authority{a}}, want: []string{"mirror.jobs.*.a_example_443", "mirror.jobs.*.a_example_443.*"}},
		{name: "tenants by authorities", f: Filter{Tenants: []string{"zeta", "acme"}, Authorities: []authority.Authority{b, a}},
			want: []string{"mirror.jobs.acme.a_example_443", "mirror.jobs.acme.a_example_443.*", "mirror.jobs.acme.b_example_8080", "mirror.jobs.acme.b_example_8080.*", "mirror.jobs.zeta.a_example_443", "mirror.jobs.zeta.a_example_443.*", "mirror.jobs.zeta.b_example_8080", "mirror.jobs.zeta.b_example_8080.*"}},
		{name: "two spellings of one authority", f: Filter{Authorities: []authority.Authority{a, aAgain}}, want: []string{"mirror.jobs.*.a_example_443", "mirror.jobs.*.a_example_443.*"}},
		{name: "tenant twice", f: Filter{Tenants: []string{"acme", "acme"}}, want: []string{"mirror.jobs.acme.*", "mirror.jobs.acme.*.*"}},
		{name: "wildcard tenant refused", f: Filter{Tenants: []string{"*"}}, wantErr: `--tenant "*"`},
		{name: "upper case tenant refused", f: Filter{Tenants: []string{"Acme"}}, wantErr: `--tenant "Acme"`},
		{name: "dotted tenant refused", f: Filter{Tenants: []string{"a.b"}, Authorities: []authority.Authority{a}}, wantErr: `--tenant "a.b"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.f.Subjects()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, ErrFilter) {
					t.Fatalf("Subjects = %v, %v; want an ErrFilter containing %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Subjects: %v", err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("Subjects = %q, want %q", got, tt.want)
			}
		})
	}
}

func mustAuthority(t *testing.T, s string) authority.Authority {
	t.Helper()
	a, err := ParseAuthority(s)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
