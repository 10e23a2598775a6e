package jobs_test

import (
	"strings"
	"testing"

	"github.com/mirrorworker/mirrorworker/jobs"
)

func TestParseDelete(t *testing.T) {
	for _, tc := range []struct {
		name      string
		in        string
		op        string
		v         int
		field     string // "" when valid
		canonical string
	}{
		{name: "fetch by default", in: `{"url":"http://h.example/a"}`, v: 1,
			canonical: `{"v":1,"id":"` + jobs.DefaultID("http://h.example/a", "h.example/a") + `","url":"http://h.example/a","target":"h.example/a","tenant":"default","kind":"artifact"}`},
		{name: "fetch named", in: `{"op":"fetch","url":"http://h.example/a"}`, v: 1},
		{name: "fetch as v2", in: `{"v":2,"url":"http://h.example/a"}`, v: 1},
		{name: "delete", in: `{"v":2,"op":"delete","url":"http://h.example/a"}`, op: jobs.OpDelete, v: 2,
			canonical: `{"v":2,"op":"delete","id":"` + jobs.DefaultDeleteID("http://h.example/a", "h.example/a") + `","url":"http://h.example/a","target":"h.example/a","tenant":"default","kind":"artifact"}`},
		{name: "delete without v", in: `{"op":"delete","url":"http://h.example/a","target":"k/a"}`, op: jobs.OpDelete, v: 2},
		{name: "delete as v1", in: `{"v":1,"op":"delete","url":"http://h.example/a"}`, field: "op"},
		{name: "unknown op", in: `{"op":"move","url":"http://h.example/a"}`, field: "op"},
		{name: "op not a string", in: `{"op":1,"url":"http://h.example/a"}`, field: "op"},
		{name: "delete with sha256", in: `{"op":"delete","url":"http://h.example/a","sha256":"` + strings.Repeat("a", 64) + `"}`, field: "sha256"},
		{name: "delete with size", in: `{"op":"delete","url":"http://h.example/a","size":3}`, field: "size"},
		{name: "delete with headers", in: `{"op":"delete","url":"http://h.example/a","headers":{"Accept":"x"}}`, field: "headers"},
		{name: "delete needs a url", in: `{"op":"delete","target":"k/a"}`, field: "url"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j, err := jobs.Parse([]byte(tc.in))
			if tc.field != "" {
				ie, ok := err.(*jobs.InvalidError)
				if !ok || ie.Field != tc.field {
					t.Fatalf("Parse = %v, want an error of field %q", err, tc.field)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if j.Op != tc.op || j.V != tc.v || j.IsDelete() != (tc.op == jobs.OpDelete) {
				t.Errorf("op %q v %d, want %q %d", j.Op, j.V, tc.op, tc.v)
			}
			b, err := j.Canonical()
			if err != nil {
				t.Fatal(err)
			}
			if tc.canonical != "" && string(b) != tc.canonical {
				t.Errorf("canonical\n got %s\nwant %s", b, tc.canonical)
			}
			if again, err := jobs.Parse(b); err != nil || again.Op != j.Op || again.ID != j.ID {
				t.Errorf("the canonical form parses as %+v, %v", again, err)
			}
		})
	}
}

// A delete built by hand gets version 2 and its own default id, so that
// the stream's duplicate window never takes it for the fetch of its key.
func TestNewMsgDelete(t *testing.T) {
	m, j, err := jobs.NewMsg(jobs.Job{Op: jobs.OpDelete, URL: "http://h.example/a"})
	if err != nil {
		t.Fatal(err)
	}
	if j.V != 2 || j.ID == jobs.DefaultID(j.URL, j.Target) || m.Header.Get("Nats-Msg-Id") != j.ID {
		t.Errorf("delete job %+v, id header %q", j, m.Header.Get("Nats-Msg-Id"))
	}
	f, _ := jobs.Parse([]byte(`{"url":"http://h.example/a"}`))
	if m.Subject != f.Subject() {
		t.Errorf("delete on %q, its key's fetches on %q", m.Subject, f.Subject())
	}
}
