package jobs

import (
	"strings"

	"github.com/mirrorworker/mirrorworker/authority"
)

// Subject prefixes. A job goes to mirror.jobs.<tenant>.<akey>, its dead
// letter to mirror.dlq.<tenant>.<akey>, a pacer fact to
// mirror.events.pacer.<akey>; akey is authority.Authority.Key.
const (
	JobsSubjectPrefix   = "mirror.jobs."
	DLQSubjectPrefix    = "mirror.dlq."
	EventsSubjectPrefix = "mirror.events."
	PacerEventPrefix    = "mirror.events.pacer."
)

// InvalidToken replaces a tenant or akey that cannot be used in a subject,
// so that even a job whose subject is garbage has a dead-letter subject.
const InvalidToken = "invalid"

// Subject returns mirror.jobs.<tenant>.<akey> for a parsed job.
func (j Job) Subject() string {
	return JobsSubjectPrefix + j.Tenant + "." + j.Authority.Key()
}

// JobsSubjectFilters returns the subject filters of one tenant's jobs to one
// authority as MIRROR_JOBS stores them: with their partition token, and
// without it (jobs stored by an earlier version); "*" for either is a
// wildcard (JobsSubjectFilters("*", akey) selects one authority's jobs of
// every tenant, for replay).
func JobsSubjectFilters(tenant, akey string) []string {
	return []string{JobsSubjectPrefix + tenant + "." + akey, JobsSubjectPrefix + tenant + "." + akey + ".*"}
}

// ParseSubject splits mirror.jobs.<tenant>.<akey> (or the same job as stored,
// mirror.jobs.<tenant>.<akey>.<p>, or parked, mirror.parked.<p>.<tenant>.<akey>). The error is an
// *InvalidError for field "subject".
func ParseSubject(subject string) (tenant, akey string, err error) {
	if strings.HasPrefix(subject, ParkSubjectPrefix) || strings.Count(subject, ".") == 4 {
		// As stored, with its partition, or parked.
		_, tenant, akey, err = ParsePartitionSubject(subject)
		return tenant, akey, err
	}
	rest, ok := strings.CutPrefix(subject, JobsSubjectPrefix)
	if !ok {
		return "", "", invalid("subject", "%q does not start with %q", Truncate(subject, 300), JobsSubjectPrefix)
	}
	tenant, akey, ok = strings.Cut(rest, ".")
	if !ok || !ValidTenant(tenant) || !validAkey(akey) {
		return "", "", invalid("subject", "%q is not %s<tenant>.<akey>", Truncate(subject, 300), JobsSubjectPrefix)
	}
	return tenant, akey, nil
}

// CheckSubject reports whether a job arrived on the subject it belongs to:
// the subject's tenant token must be the job's tenant and its akey the key
// of the job's URL authority. A job that does not match is invalid (it could
// bypass per-tenant fairness or per-authority partitioning). The error is an
// *InvalidError for field "subject".
func CheckSubject(j Job, subject string) error {
	tenant, akey, err := ParseSubject(subject)
	if err != nil {
		return err
	}
	if tenant != j.Tenant {
		return invalid("subject", "tenant token %q is not the job's tenant %q", tenant, j.Tenant)
	}
	a := j.Authority
	if a.IsZero() {
		if a, err = authority.Parse(j.URL); err != nil {
			return invalid("url", "%v", err)
		}
	}
	if akey != a.Key() {
		return invalid("subject", "authority token %q is not the url's %q", akey, a.Key())
	}
	return nil
}

// DeadLetterSubject returns mirror.dlq.<tenant>.<akey>. A tenant or akey that
// is not a valid token (empty, or from a job that could not be parsed) is
// replaced by InvalidToken, so the result is always a publishable subject.
func DeadLetterSubject(tenant, akey string) string {
	if !ValidTenant(tenant) {
		tenant = InvalidToken
	}
	if !validAkey(akey) {
		akey = InvalidToken
	}
	return DLQSubjectPrefix + tenant + "." + akey
}

// DeadLetterSubjectFor returns the dead-letter subject of a message that
// arrived on jobSubject, keeping each of its tenant and akey tokens that is
// valid on its own (see DeadLetterSubject).
func DeadLetterSubjectFor(jobSubject string) string {
	if tenant, akey, err := ParseSubject(jobSubject); err == nil {
		return DeadLetterSubject(tenant, akey)
	}
	rest, ok := strings.CutPrefix(jobSubject, JobsSubjectPrefix)
	if !ok {
		return DeadLetterSubject("", "")
	}
	tenant, akey, _ := strings.Cut(rest, ".")
	return DeadLetterSubject(tenant, akey)
}

// EventSubject returns mirror.events.pacer.<akey>.
func EventSubject(akey string) string {
	return PacerEventPrefix + akey
}

// OperatorEventSubject returns mirror.events.pacer.<akey>.operator, the
// subject of an operator's pause and resume of the authority: a subject of
// their own, so that the newest of them is found by subject however many
// pacer facts follow it (the cold start reads the newest fact of every
// subject), and PacerEventPrefix + ">" reads both.
func OperatorEventSubject(akey string) string {
	return PacerEventPrefix + akey + ".operator"
}

// validAkey reports whether s could be an authority key: one non-empty
// subject token made of the characters authority.Key produces.
func validAkey(s string) bool {
	return tokenChars(s)
}
