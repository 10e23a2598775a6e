package jobs_test

import (
	"errors"
	"testing"

	"github.com/mirrorworker/mirrorworker/jobs"
)

func mustParse(t testing.TB, s string) jobs.Job {
	t.Helper()
	j, err := jobs.Parse([]byte(s))
	if err != nil {
		t.Fatalf("Parse(%s): %v", s, err)
	}
	return j
}

func TestSubject(t *testing.T) {
	tests := []struct {
		name string
		job  string
		want string
	}{
		{"default tenant and port", `{"url":"https://Files.Example.org/a"}`, "mirror.jobs.default.files_example_org_443"},
		{"tenant and port", `{"url":"http://h.example:8080/a","tenant":"acme"}`, "mirror.jobs.acme.h_example_8080"},
		{"IPv6", `{"url":"http://[::1]:9000/a"}`, "mirror.jobs.default.___1__9000"},
		{"IPv4", `{"url":"http://127.0.0.1/a"}`, "mirror.jobs.default.127_0_0_1_80"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := mustParse(t, tt.job)
			if got := j.Subject(); got != tt.want {
				t.Fatalf("Subject() = %q, want %q", got, tt.want)
			}
			tenant, akey, err := jobs.ParseSubject(j.Subject())
			if err != nil || tenant != j.Tenant || akey != j.Authority.Key() {
				t.Fatalf("ParseSubject = %q, %q, %v", tenant, akey, err)
			}
			if err := jobs.CheckSubject(j, j.Subject()); err != nil {
				t.Fatalf("CheckSubject(own subject): %v", err)
			}
		})
	}
}

func TestParseSubjectRejects(t *testing.T) {
	for _, s := range []string{
		"", "mirror.jobs", "mirror.jobs.", "mirror.jobs.default", "mirror.jobs.default.",
		"mirror.jobs..h_80", "mirror.jobs.default.h_80.extra", "mirror.dlq.default.h_80",
		"mirror.jobs.Default.h_80", "mirror.jobs.default.H_80", "mirror.jobs.*.h_80", "mirror.jobs.default.>",
	} {
		t.Run(s, func(t *testing.T) {
			if tenant, akey, err := jobs.ParseSubject(s); err == nil {
				t.Fatalf("ParseSubject(%q) = %q, %q, nil", s, tenant, akey)
			}
		})
	}
}

func TestCheckSubject(t *testing.T) {
	j := mustParse(t, `{"url":"https://h.example/a","tenant":"acme"}`)
	tests := []struct {
		name    string
		subject string
		ok      bool
	}{
		{"own", "mirror.jobs.acme.h_example_443", true},
		{"other tenant", "mirror.jobs.default.h_example_443", false},
		{"other authority", "mirror.jobs.acme.h_example_80", false},
		{"garbage", "foo", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := jobs.CheckSubject(j, tt.subject)
			if (err == nil) != tt.ok {
				t.Fatalf("CheckSubject(%q) = %v, want ok %v", tt.subject, err, tt.ok)
			}
			var ie *jobs.InvalidError
			if err != nil && (!errors.As(err, &ie) || ie.Code != jobs.CodeInvalidJob) {
				t.Fatalf("error %v is not an invalid_job *InvalidError", err)
			}
		})
	}
	// A hand-built job without Authority is checked against its URL.
	hand := jobs.Job{URL: "https://h.example/a", Tenant: "acme"}
	if err := jobs.CheckSubject(hand, "mirror.jobs.acme.h_example_443"); err != nil {
		t.Errorf("hand-built job: %v", err)
	}
}

func TestDeadLetterAndEventSubjects(t *testing.T) {
	tests := []struct {
		name, got, want string
	}{
		{"dlq", jobs.DeadLetterSubject("acme", "h_example_443"), "mirror.dlq.acme.h_example_443"},
		{"dlq invalid tenant", jobs.DeadLetterSubject("", "h_example_443"), "mirror.dlq.invalid.h_example_443"},
		{"dlq invalid both", jobs.DeadLetterSubject("A.B", "x.>"), "mirror.dlq.invalid.invalid"},
		{"dlq for job subject", jobs.DeadLetterSubjectFor("mirror.jobs.acme.h_example_443"), "mirror.dlq.acme.h_example_443"},
		{"dlq for bad tenant", jobs.DeadLetterSubjectFor("mirror.jobs.BAD.h_example_443"), "mirror.dlq.invalid.h_example_443"},
		{"dlq for extra tokens", jobs.DeadLetterSubjectFor("mirror.jobs.acme.h_80.x"), "mirror.dlq.acme.invalid"},
		{"dlq for garbage", jobs.DeadLetterSubjectFor("foo"), "mirror.dlq.invalid.invalid"},
		{"event", jobs.EventSubject("h_example_443"), "mirror.events.pacer.h_example_443"},
		{"operator event", jobs.OperatorEventSubject("h_example_443"), "mirror.events.pacer.h_example_443.operator"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got %q, want %q", tt.got, tt.want)
			}
		})
	}
}
