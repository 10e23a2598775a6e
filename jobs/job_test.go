package jobs_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/mirror"
)

func int64p(n int64) *int64 { return &n }

func TestParseAccepted(t *testing.T) {
	// 1024 bytes in all, every segment within mirror.MaxSegmentLen.
	long := strings.Repeat(strings.Repeat("a", mirror.MaxSegmentLen)+"/", 4) + strings.Repeat("a", 1024-len("h.example/")-4*(mirror.MaxSegmentLen+1))
	tests := []struct {
		name string
		in   string
		want jobs.Job // Authority is checked separately
	}{
		{
			name: "minimal with defaults",
			in:   `{"url":"https://Files.Example.org/a/b.tar.gz"}`,
			want: jobs.Job{V: 1, ID: jobs.DefaultID("https://Files.Example.org/a/b.tar.gz", "files.example.org/a/b.tar.gz"),
				URL: "https://Files.Example.org/a/b.tar.gz", Target: "files.example.org/a/b.tar.gz", Tenant: "default", Kind: "artifact"},
		},
		{
			name: "every field",
			in: `{"v":1,"id":"Job-1.2_3:4","url":"http://h.example/x","target":"mirror/x.bin",
				"sha256":"ABCDEF0123456789abcdef0123456789ABCDEF0123456789abcdef0123456789","size":42,
				"tenant":"acme_1-x","kind":"companion","headers":{"accept":"application/json","ACCEPT-language":"en"}}`,
			want: jobs.Job{V: 1, ID: "Job-1.2_3:4", URL: "http://h.example/x", Target: "mirror/x.bin",
				SHA256: "abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789", Size: int64p(42),
				Tenant: "acme_1-x", Kind: "companion", Headers: map[string]string{"Accept": "application/json", "Accept-Language": "en"}},
		},
		{
			name: "unknown fields ignored, nulls are absent",
			in:   `{"url":"http://h.example/x","future":{"a":[1,2,{"b":null}]},"tenant":null,"kind":null,"v":null,"headers":null,"size":null}`,
			want: jobs.Job{V: 1, ID: jobs.DefaultID("http://h.example/x", "h.example/x"), URL: "http://h.example/x", Target: "h.example/x", Tenant: "default", Kind: "artifact"},
		},
		{
			name: "field names are case-sensitive: URL is an unknown field",
			in:   `{"url":"http://h.example/x","URL":"http://other.example/y"}`,
			want: jobs.Job{V: 1, ID: jobs.DefaultID("http://h.example/x", "h.example/x"), URL: "http://h.example/x", Target: "h.example/x", Tenant: "default", Kind: "artifact"},
		},
		{
			name: "non-default port",
			in:   `{"url":"https://h.example:8443/a"}`,
			want: jobs.Job{V: 1, ID: jobs.DefaultID("https://h.example:8443/a", "h.example_8443/a"), URL: "https://h.example:8443/a", Target: "h.example_8443/a", Tenant: "default", Kind: "artifact"},
		},
		{
			name: "explicit default port is the default",
			in:   `{"url":"http://h.example:80/a"}`,
			want: jobs.Job{V: 1, ID: jobs.DefaultID("http://h.example:80/a", "h.example/a"), URL: "http://h.example:80/a", Target: "h.example/a", Tenant: "default", Kind: "artifact"},
		},
		{
			name: "path ending in slash",
			in:   `{"url":"http://h.example/dir/"}`,
			want: jobs.Job{V: 1, ID: jobs.DefaultID("http://h.example/dir/", "h.example/dir/index"), URL: "http://h.example/dir/", Target: "h.example/dir/index", Tenant: "default", Kind: "artifact"},
		},
		{
			name: "empty path",
			in:   `{"url":"http://h.example"}`,
			want: jobs.Job{V: 1, ID: jobs.DefaultID("http://h.example", "h.example/index"), URL: "http://h.example", Target: "h.example/index", Tenant: "default", Kind: "artifact"},
		},
		{
			name: "percent-encoded path is decoded",
			in:   `{"url":"http://h.example/a%20b/c%2Fd"}`,
			want: jobs.Job{V: 1, ID: jobs.DefaultID("http://h.example/a%20b/c%2Fd", "h.example/a b/c/d"), URL: "http://h.example/a%20b/c%2Fd", Target: "h.example/a b/c/d", Tenant: "default", Kind: "artifact"},
		},
		{
			name: "IDN host to punycode",
			in:   `{"url":"https://bücher.example/x"}`,
			want: jobs.Job{V: 1, ID: jobs.DefaultID("https://bücher.example/x", "xn--bcher-kva.example/x"), URL: "https://bücher.example/x", Target: "xn--bcher-kva.example/x", Tenant: "default", Kind: "artifact"},
		},
		{
			name: "query with explicit target",
			in:   `{"url":"http://h.example/get?id=1","target":"h/1"}`,
			want: jobs.Job{V: 1, ID: jobs.DefaultID("http://h.example/get?id=1", "h/1"), URL: "http://h.example/get?id=1", Target: "h/1", Tenant: "default", Kind: "artifact"},
		},
		{
			name: "target of exactly 1024 bytes, size 0, empty headers",
			in:   `{"url":"http://h.example/x","target":"h.example/` + long + `","size":0,"headers":{}}`,
			want: jobs.Job{V: 1, ID: jobs.DefaultID("http://h.example/x", "h.example/"+long), URL: "http://h.example/x", Target: "h.example/" + long, Size: int64p(0), Tenant: "default", Kind: "artifact"},
		},
		{
			name: "target with a dotted name that is not reserved",
			in:   `{"url":"http://h.example/x","target":".mirrorworkers/x/..a"}`,
			want: jobs.Job{V: 1, ID: jobs.DefaultID("http://h.example/x", ".mirrorworkers/x/..a"), URL: "http://h.example/x", Target: ".mirrorworkers/x/..a", Tenant: "default", Kind: "artifact"},
		},
		{
			name: "id of 128 characters, metadata kind",
			in:   `{"url":"http://h.example/x","id":"` + strings.Repeat("z", 128) + `","kind":"metadata"}`,
			want: jobs.Job{V: 1, ID: strings.Repeat("z", 128), URL: "http://h.example/x", Target: "h.example/x", Tenant: "default", Kind: "metadata"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := jobs.Parse([]byte(tt.in))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			want := tt.want
			a, err := authority.Parse(want.URL)
			if err != nil {
				t.Fatal(err)
			}
			want.Authority = a
			if !reflect.DeepEqual(got, want) {
				t.Errorf("Parse =\n %+v\nwant\n %+v", got, want)
			}
			// The canonical form parses back to the same job.
			b, err := got.Canonical()
			if err != nil {
				t.Fatal(err)
			}
			again, err := jobs.Parse(b)
			if err != nil {
				t.Fatalf("Parse(canonical %s): %v", b, err)
			}
			if !reflect.DeepEqual(again, got) {
				t.Errorf("canonical round trip changed the job:\n %+v\n %+v", again, got)
			}
		})
	}
}

func TestParseRejected(t *testing.T) {
	tests := []struct {
		name  string
		in    string
		code  string // default invalid_job
		field string
		msg   string // substring of the message
	}{
		{name: "empty input", in: ``, msg: "malformed JSON"},
		{name: "malformed JSON", in: `{"url":`, msg: "malformed JSON"},
		{name: "trailing garbage", in: `{"url":"http://h.example/x"} x`, msg: "malformed JSON"},
		{name: "two objects", in: `{"url":"http://h.example/x"}{}`, msg: "malformed JSON"},
		{name: "array", in: `[{"url":"http://h.example/x"}]`, msg: "JSON object"},
		{name: "null", in: `null`, msg: "JSON object"},
		{name: "string", in: `"http://h.example/x"`, msg: "JSON object"},
		{name: "duplicate key", in: `{"url":"http://h.example/x","url":"http://evil.example/y"}`, msg: `duplicate key "url"`},
		{name: "duplicate nested key", in: `{"url":"http://h.example/x","headers":{"Accept":"a","Accept":"b"}}`, msg: `duplicate key "Accept"`},
		{name: "duplicate key deep in unknown field", in: `{"url":"http://h.example/x","x":[{"a":1,"a":2}]}`, msg: "duplicate key"},
		{name: "invalid UTF-8", in: "{\"url\":\"http://h.example/\xff\"}", msg: "UTF-8"},
		{name: "too large", in: `{"url":"http://h.example/x","pad":"` + strings.Repeat("p", jobs.MaxJobLen) + `"}`, msg: "more than"},

		{name: "v too new", in: `{"v":3,"url":"http://h.example/x"}`, code: jobs.CodeUnsupportedVersion, field: "v", msg: "newer"},
		{name: "v too new wins over other errors", in: `{"v":3,"url":"ftp://x"}`, code: jobs.CodeUnsupportedVersion, field: "v"},
		{name: "v huge", in: `{"v":123456789012345678901234567890,"url":"http://h.example/x"}`, code: jobs.CodeUnsupportedVersion, field: "v"},
		{name: "v zero", in: `{"v":0,"url":"http://h.example/x"}`, field: "v"},
		{name: "v negative", in: `{"v":-1,"url":"http://h.example/x"}`, field: "v"},
		{name: "v negative huge", in: `{"v":-123456789012345678901234567890,"url":"http://h.example/x"}`, field: "v"},
		{name: "v fraction", in: `{"v":1.5,"url":"http://h.example/x"}`, field: "v", msg: "integer"},
		{name: "v exponent", in: `{"v":1e0,"url":"http://h.example/x"}`, field: "v", msg: "integer"},
		{name: "v string", in: `{"v":"1","url":"http://h.example/x"}`, field: "v", msg: "integer"},

		{name: "url missing", in: `{"target":"a"}`, field: "url", msg: "required"},
		{name: "url null", in: `{"url":null}`, field: "url", msg: "required"},
		{name: "url number", in: `{"url":42}`, field: "url", msg: "string"},
		{name: "url empty", in: `{"url":""}`, field: "url"},
		{name: "url relative", in: `{"url":"/a/b"}`, field: "url", msg: "absolute"},
		{name: "url ftp", in: `{"url":"ftp://h.example/x"}`, field: "url", msg: "http or https"},
		{name: "url opaque", in: `{"url":"http:h.example/x"}`, field: "url", msg: "host"},
		{name: "url no host", in: `{"url":"http:///x"}`, field: "url", msg: "host"},
		{name: "url userinfo", in: `{"url":"https://user:pw@h.example/x"}`, field: "url", msg: "userinfo"},
		{name: "url empty userinfo", in: `{"url":"https://@h.example/x"}`, field: "url", msg: "userinfo"},
		{name: "url bad port", in: `{"url":"http://h.example:99999/x"}`, field: "url", msg: "port"},
		{name: "url port zero", in: `{"url":"http://h.example:0/x"}`, field: "url", msg: "port"},
		{name: "url bad host", in: `{"url":"http://h ex/x"}`, field: "url"},
		{name: "url with control character", in: `{"url":"http://h.example/a\u0001b"}`, field: "url"},
		{name: "url too long", in: `{"url":"http://h.example/` + strings.Repeat("a", jobs.MaxURLLen) + `"}`, field: "url", msg: "more than"},

		{name: "query without target", in: `{"url":"http://h.example/get?id=1"}`, field: "target", msg: "query"},
		{name: "target empty", in: `{"url":"http://h.example/x","target":""}`, field: "target", msg: "empty"},
		{name: "target number", in: `{"url":"http://h.example/x","target":1}`, field: "target", msg: "string"},
		{name: "target too long", in: `{"url":"http://h.example/x","target":"` + strings.Repeat("a", 1025) + `"}`, field: "target", msg: "more than"},
		{name: "target segment too long", in: `{"url":"http://h.example/x","target":"a/` + strings.Repeat("a", 251) + `"}`, field: "target", msg: "segment"},
		{name: "target leading slash", in: `{"url":"http://h.example/x","target":"/etc/passwd"}`, field: "target", msg: "start"},
		{name: "target empty segment", in: `{"url":"http://h.example/x","target":"a//b"}`, field: "target", msg: "empty segment"},
		{name: "target trailing slash", in: `{"url":"http://h.example/x","target":"a/b/"}`, field: "target", msg: "empty segment"},
		{name: "target dot", in: `{"url":"http://h.example/x","target":"a/./b"}`, field: "target", msg: `"."`},
		{name: "target dotdot", in: `{"url":"http://h.example/x","target":"a/../../b"}`, field: "target", msg: `".."`},
		{name: "target only dotdot", in: `{"url":"http://h.example/x","target":".."}`, field: "target", msg: `".."`},
		{name: "target backslash", in: `{"url":"http://h.example/x","target":"a\\..\\b"}`, field: "target", msg: `"\"`},
		{name: "target NUL", in: `{"url":"http://h.example/x","target":"a\u0000b"}`, field: "target", msg: "NUL"},
		{name: "target newline", in: `{"url":"http://h.example/x","target":"a\nb"}`, field: "target", msg: "control"},
		{name: "target reserved", in: `{"url":"http://h.example/x","target":".mirrorworker/meta/x"}`, field: "target", msg: "reserved"},
		{name: "target reserved itself", in: `{"url":"http://h.example/x","target":".mirrorworker"}`, field: "target", msg: "reserved"},
		{name: "target reserved other case", in: `{"url":"http://h.example/x","target":".MirrorWorker/tmp/x"}`, field: "target", msg: "reserved"},
		{name: "default target escapes with encoded dotdot", in: `{"url":"http://h.example/a/%2e%2e/%2E%2E/etc/passwd"}`, field: "target", msg: `".."`},
		{name: "default target with literal dotdot", in: `{"url":"http://h.example/a/../b"}`, field: "target", msg: `".."`},
		{name: "default target with encoded slash making empty segment", in: `{"url":"http://h.example/a%2F%2Fb"}`, field: "target", msg: "empty segment"},
		{name: "default target with double slash", in: `{"url":"http://h.example//x"}`, field: "target", msg: "empty segment"},
		{name: "default target with encoded NUL", in: `{"url":"http://h.example/a%00b"}`, field: "target", msg: "NUL"},
		{name: "default target with encoded backslash", in: `{"url":"http://h.example/a%5C..%5Cb"}`, field: "target"},
		{name: "default target with invalid UTF-8", in: `{"url":"http://h.example/a%ffb"}`, field: "target", msg: "UTF-8"},
		{name: "default target too long", in: `{"url":"http://h.example/` + strings.Repeat("a", 1100) + `"}`, field: "target", msg: "more than"},

		{name: "id empty", in: `{"url":"http://h.example/x","id":""}`, field: "id"},
		{name: "id too long", in: `{"url":"http://h.example/x","id":"` + strings.Repeat("a", 129) + `"}`, field: "id"},
		{name: "id with slash", in: `{"url":"http://h.example/x","id":"a/b"}`, field: "id"},
		{name: "id with space", in: `{"url":"http://h.example/x","id":"a b"}`, field: "id"},
		{name: "id number", in: `{"url":"http://h.example/x","id":7}`, field: "id", msg: "string"},

		{name: "sha256 short", in: `{"url":"http://h.example/x","sha256":"abc"}`, field: "sha256"},
		{name: "sha256 not hex", in: `{"url":"http://h.example/x","sha256":"` + strings.Repeat("g", 64) + `"}`, field: "sha256"},
		{name: "sha256 long", in: `{"url":"http://h.example/x","sha256":"` + strings.Repeat("a", 65) + `"}`, field: "sha256"},
		{name: "sha256 array", in: `{"url":"http://h.example/x","sha256":["a"]}`, field: "sha256", msg: "string"},

		{name: "size negative", in: `{"url":"http://h.example/x","size":-1}`, field: "size"},
		{name: "size fraction", in: `{"url":"http://h.example/x","size":1.5}`, field: "size"},
		{name: "size string", in: `{"url":"http://h.example/x","size":"10"}`, field: "size"},
		{name: "size overflow", in: `{"url":"http://h.example/x","size":99999999999999999999}`, field: "size"},

		{name: "tenant empty", in: `{"url":"http://h.example/x","tenant":""}`, field: "tenant"},
		{name: "tenant upper case", in: `{"url":"http://h.example/x","tenant":"Acme"}`, field: "tenant"},
		{name: "tenant with dot", in: `{"url":"http://h.example/x","tenant":"a.b"}`, field: "tenant"},
		{name: "tenant wildcard", in: `{"url":"http://h.example/x","tenant":"*"}`, field: "tenant"},
		{name: "tenant too long", in: `{"url":"http://h.example/x","tenant":"` + strings.Repeat("t", 65) + `"}`, field: "tenant"},
		{name: "tenant bool", in: `{"url":"http://h.example/x","tenant":true}`, field: "tenant", msg: "string"},

		{name: "kind unknown", in: `{"url":"http://h.example/x","kind":"video"}`, field: "kind"},
		{name: "kind wrong case", in: `{"url":"http://h.example/x","kind":"Artifact"}`, field: "kind"},

		{name: "headers array", in: `{"url":"http://h.example/x","headers":["Accept"]}`, field: "headers", msg: "object"},
		{name: "headers non-string value", in: `{"url":"http://h.example/x","headers":{"Accept":1}}`, field: "headers", msg: "object"},
		{name: "header not allowed", in: `{"url":"http://h.example/x","headers":{"Authorization":"Bearer x"}}`, field: "headers", msg: "not allowed"},
		{name: "header Range not allowed", in: `{"url":"http://h.example/x","headers":{"Accept":"*/*","Range":"bytes=0-1"}}`, field: "headers", msg: `"Range"`},
		{name: "header twice in different case", in: `{"url":"http://h.example/x","headers":{"Accept":"a","accept":"b"}}`, field: "headers", msg: "twice"},
		{name: "header name with space", in: `{"url":"http://h.example/x","headers":{"Accept ":"a"}}`, field: "headers", msg: "not allowed"},
		{name: "header value with newline", in: `{"url":"http://h.example/x","headers":{"Accept":"a\r\nX-Evil: 1"}}`, field: "headers", msg: "control"},
		{name: "header value too long", in: `{"url":"http://h.example/x","headers":{"Accept":"` + strings.Repeat("a", 4097) + `"}}`, field: "headers"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j, err := jobs.Parse([]byte(tt.in))
			if err == nil {
				t.Fatalf("Parse accepted %+v", j)
			}
			var ie *jobs.InvalidError
			if !errors.As(err, &ie) {
				t.Fatalf("error %T %v is not an *InvalidError", err, err)
			}
			code := tt.code
			if code == "" {
				code = jobs.CodeInvalidJob
			}
			if ie.Code != code || ie.Field != tt.field {
				t.Errorf("got code %q field %q (%v), want code %q field %q", ie.Code, ie.Field, err, code, tt.field)
			}
			if !strings.Contains(ie.Msg, tt.msg) {
				t.Errorf("message %q does not contain %q", ie.Msg, tt.msg)
			}
			if tt.field != "" && !strings.HasPrefix(err.Error(), tt.field+": ") {
				t.Errorf("Error() = %q, want the field first", err.Error())
			}
			if len(err.Error()) > 600 {
				t.Errorf("message is %d bytes long: %.100q...", len(err.Error()), err.Error())
			}
		})
	}
}

func TestCheckTarget(t *testing.T) {
	tests := []struct {
		key string
		ok  bool
	}{
		{"a", true},
		{"a/b/c.txt", true},
		{"a/.hidden", true},
		{"", false},
		{"a/", false},
		{"/a", false},
		{"a/../b", false},
		{".mirrorworker/tmp/x", false},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			err := jobs.CheckTarget(tt.key)
			if (err == nil) != tt.ok {
				t.Errorf("CheckTarget(%q) = %v, want ok %v", tt.key, err, tt.ok)
			}
		})
	}
}

func TestTruncate(t *testing.T) {
	for _, tt := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"abcdef", 3, "abc..."},
		{"aé", 2, "a..."}, // é is two bytes: never split
		{"日本語", 4, "日..."},
	} {
		got := jobs.Truncate(tt.in, tt.n)
		if got != tt.want || !utf8.ValidString(got) {
			t.Errorf("Truncate(%q, %d) = %q, want %q", tt.in, tt.n, got, tt.want)
		}
	}
}

// TestCheckTargetIsTheMirrorRule: a job's target is refused exactly when the
// mirror would refuse the key, segment length included.
func TestCheckTargetIsTheMirrorRule(t *testing.T) {
	for _, key := range []string{"a/b", strings.Repeat("s", 250), strings.Repeat("s", 251), ".MirrorWorker/x", "a\x01b", "a/\xff"} {
		jerr, merr := jobs.CheckTarget(key), mirror.ValidateKey(key)
		if (jerr == nil) != (merr == nil) {
			t.Errorf("key %.40q: jobs %v, mirror %v", key, jerr, merr)
		}
	}
}
