package main

import (
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/admin"
	"github.com/mirrorworker/mirrorworker/credentials"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/worker"
)

// helpDefaults reads each flag's "(default X)" out of a command's help.
func helpDefaults(help string) map[string]string {
	got := map[string]string{}
	flagLine := regexp.MustCompile(`^  -(\S+)`)
	def := regexp.MustCompile(`\(default (.*)\)$`)
	name := ""
	for _, line := range regexp.MustCompile(`\n`).Split(help, -1) {
		if m := flagLine.FindStringSubmatch(line); m != nil {
			name = m[1]
			continue
		}
		if m := def.FindStringSubmatch(line); m != nil && name != "" {
			got[name] = m[1]
		}
	}
	return got
}

// TestHelpDefaultsAreTheConstants: the defaults run's help shows are the
// exported constants of the options they set (a default has one home: the
// flag reads it, and so does the option's zero value), not copies of them.
func TestHelpDefaultsAreTheConstants(t *testing.T) {
	help, _, err := runCmd(t, nil, "run", "-h")
	if err != nil {
		t.Fatalf("run -h: %v", err)
	}
	got := helpDefaults(help)
	dur := func(d time.Duration) string { return d.String() }
	for _, tt := range []struct {
		flag, want string
	}{
		{"shutdown-grace", dur(worker.DefaultShutdownGrace)},
		{"park-after", dur(worker.DefaultParkAfter)},
		{"lane-backlog", strconv.Itoa(worker.DefaultLaneBacklog)},
		{"failure-budget", strconv.Itoa(worker.DefaultFailureBudget)},
		{"concurrency", strconv.Itoa(worker.DefaultConcurrency())},
		{"auth-hold", dur(worker.DefaultAuthHold)},
		{"auth-holds", strconv.Itoa(worker.DefaultAuthHolds)},
		{"max-deletes-per-minute", strconv.Itoa(worker.DefaultMaxDeletesPerMinute)},
		{"floor", dur(pacer.DefaultFloor)},
		{"max-in-flight", strconv.Itoa(pacer.DefaultMaxInFlight)},
		{"ack-wait", dur(jobs.DefaultAckWait)},
		{"max-ack-pending", strconv.Itoa(jobs.DefaultMaxAckPending)},
		{"jobs-max-age", dur(jobs.DefaultJobsMaxAge)},
		{"partitions", strconv.Itoa(jobs.DefaultPartitions)},
		{"lease-ttl", dur(jobs.DefaultLeaseTTL)},
		{"origin-connect-timeout", dur(fetch.DefaultConnectTimeout)},
		{"header-timeout", dur(fetch.DefaultResponseHeaderTimeout)},
		{"idle-timeout", dur(fetch.DefaultIdleTimeout)},
		{"max-idle-conns", strconv.Itoa(fetch.DefaultMaxIdleConns)},
		{"min-transfer-window", dur(fetch.DefaultMinRateWindow)},
		{"body-deadline-base", dur(fetch.DefaultDeadlineBase)},
		{"credentials-reload", dur(credentials.DefaultReloadInterval)},
		{"admin-addr", strconv.Quote(admin.DefaultAddr)},
		{"data-dir", strconv.Quote(defaultDataDir)},
		{"embedded-listen", strconv.Quote(defaultEmbeddedListen)},
	} {
		if g, ok := got[tt.flag]; !ok || g != tt.want {
			t.Errorf("run -h: --%s (default %s), want %s", tt.flag, g, tt.want)
		}
	}
}
