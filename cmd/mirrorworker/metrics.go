package main

import (
	"regexp"
	"runtime"
	"sort"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// newBuildInfo is mirrorworker_build_info{version,goversion} = 1, so that a
// dashboard shows which build each pod runs.
func newBuildInfo(version string) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "mirrorworker_build_info",
		Help:        "Always 1; the labels tell the mirrorworker version and the Go version it was built with.",
		ConstLabels: prometheus.Labels{"version": version, "goversion": runtime.Version()},
	}, func() float64 { return 1 })
}

// metricRegistry is the worker's Prometheus registry. It also remembers the
// name of every metric registered with it, from the collectors' own
// descriptions, so that a test can check the dashboards and alert rules
// against the metrics the worker really exports (deploy/metrics/names.txt).
// Safe for concurrent use.
type metricRegistry struct {
	*prometheus.Registry

	mu    sync.Mutex
	names map[string]bool
}

var _ prometheus.Registerer = (*metricRegistry)(nil)

func newMetricRegistry() *metricRegistry {
	return &metricRegistry{Registry: prometheus.NewRegistry(), names: map[string]bool{}}
}

// Register implements prometheus.Registerer.
func (r *metricRegistry) Register(c prometheus.Collector) error {
	if err := r.Registry.Register(c); err != nil {
		return err
	}
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	r.mu.Lock()
	defer r.mu.Unlock()
	for d := range ch {
		// Desc has no accessor for its name; its String form is stable:
		// Desc{fqName: "name", help: ...}.
		if m := fqNameRE.FindStringSubmatch(d.String()); m != nil {
			r.names[m[1]] = true
		}
	}
	return nil
}

// MustRegister implements prometheus.Registerer.
func (r *metricRegistry) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

var fqNameRE = regexp.MustCompile(`fqName: "([^"]+)"`)

// Names returns the names of the registered metrics, sorted.
func (r *metricRegistry) Names() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.names))
	for n := range r.names {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
