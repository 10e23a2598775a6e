package replay_test

import (
	"fmt"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/replay"
)

func ExampleParseStart() {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, args := range [][3]string{{"", "", ""}, {"52000", "", ""}, {"", "7d", ""}, {"", "", "2026-11-29T08:00:00Z"}, {"1", "24h", ""}} {
		s, err := replay.ParseStart(args[0], args[1], args[2], now)
		if err != nil {
			fmt.Println("error:", err)
			continue
		}
		fmt.Println(s)
	}
	// Output:
	// from the beginning
	// from sequence 52000
	// since 168h0m0s
	// from 2026-11-29T08:00:00Z
	// error: start: --from-seq and --since are mutually exclusive: give one
}

func ExampleFilter_Subjects() {
	a, _ := replay.ParseAuthority("https://files.example.org/pub/a.tgz")
	b, _ := replay.ParseAuthority("mirror.example.net:8443")
	f := replay.Filter{Tenants: []string{"acme"}, Authorities: []authority.Authority{a, b}}
	subjects, _ := f.Subjects()
	fmt.Println(subjects)
	// Output:
	// [mirror.jobs.acme.files_example_org_443 mirror.jobs.acme.files_example_org_443.* mirror.jobs.acme.mirror_example_net_8443 mirror.jobs.acme.mirror_example_net_8443.*]
}
