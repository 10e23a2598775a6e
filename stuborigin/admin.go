package stuborigin

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// AdminHandler serves the operator endpoints:
//
//	GET  /metrics   Prometheus text format (this origin's metrics only)
//	GET  /stats     JSON Stats; ?identities=0 leaves out the identities
//	GET  /faults    the faults in force
//	POST /faults    replace them (JSON Faults; 400 with the problems if invalid)
//	GET  /healthz   200 "ok"
//
// It names tenants and principals: bind it where only operators reach it.
func (og *Origin) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		og.WriteMetrics(w)
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		with := r.URL.Query().Get("identities")
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(og.stats(with != "0" && with != "false"))
	})
	mux.HandleFunc("GET /faults", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, og.Faults())
	})
	mux.HandleFunc("POST /faults", func(w http.ResponseWriter, r *http.Request) {
		var f Faults
		dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&f); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "decode faults: " + err.Error()})
			return
		}
		if err := og.SetFaults(f); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, og.Faults())
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok\n")
	})
	return mux
}

// Metric names. Written by hand in the Prometheus text format: the origin
// keeps its own counters (no global registry), and its label sets are fixed
// and small.
const (
	metricRequests   = "mirrorworker_stub_requests_total"
	metricAdmissions = "mirrorworker_stub_admissions_total"
	metricRejections = "mirrorworker_stub_rejections_total"
	metricBudget     = "mirrorworker_stub_capacity_error_budget"
	metricIdentities = "mirrorworker_stub_identities"
)

// WriteMetrics writes the origin's metrics in the Prometheus text
// exposition format (version 0.0.4).
func (og *Origin) WriteMetrics(w io.Writer) error {
	bw := bufio.NewWriter(w)
	type row struct {
		labels string
		v      int64
	}
	var req, adm, rej, ids []row
	for _, s := range og.shards {
		s.mu.Lock()
		auth := `authority="` + escapeLabel(s.name) + `"`
		for _, kind := range sortedKeys(s.byKind) {
			k := s.byKind[kind]
			l := auth + `,caller="` + kind + `"`
			req = append(req, row{l, k.requests})
			adm = append(adm, row{l, k.admitted})
			for _, reason := range sortedKeys(k.rejected) {
				code := "rate_limited"
				switch reason {
				case ReasonShard, ReasonStoreDown, ReasonIdentityLimit:
					code = "capacity_exhausted"
				}
				rej = append(rej, row{l + `,code="` + code + `",reason="` + reason + `"`, k.rejected[reason]})
			}
		}
		ids = append(ids, row{auth, int64(len(s.ids))})
		s.mu.Unlock()
	}
	family := func(name, typ, help string, rows []row) {
		fmt.Fprintf(bw, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
		for _, r := range rows {
			fmt.Fprintf(bw, "%s{%s} %d\n", name, r.labels, r.v)
		}
	}
	family(metricRequests, "counter", "Requests received, by authority and caller class (authenticated, anonymous).", req)
	family(metricAdmissions, "counter", "Requests admitted by the limiter, by authority and caller class.", adm)
	family(metricRejections, "counter", "Requests refused, by authority, caller class, code (rate_limited: 429, capacity_exhausted: 503) and reason.", rej)
	family(metricIdentities, "gauge", "Caller identities tracked, by authority.", ids)
	fmt.Fprintf(bw, "# HELP %s Fraction of requests the profile allows to be refused with capacity_exhausted.\n# TYPE %s gauge\n%s %s\n",
		metricBudget, metricBudget, metricBudget, strconv.FormatFloat(og.profile.errorBudget(), 'g', -1, 64))
	return bw.Flush()
}

func escapeLabel(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}
