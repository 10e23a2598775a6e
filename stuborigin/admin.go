package stuborigin

import (
	"encoding/json"
	"io"
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"
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
	mux.Handle("GET /metrics", promhttp.HandlerFor(og.reg, promhttp.HandlerOpts{
		ErrorLog:      promLogger{og.log},
		ErrorHandling: promhttp.ContinueOnError,
	}))
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
