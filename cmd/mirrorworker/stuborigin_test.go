package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/stuborigin"
)

func TestStubOriginCommand(t *testing.T) {
	dir := t.TempDir()
	urlsFile := filepath.Join(dir, "urls.json")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	outR, outW := io.Pipe()
	var stderr strings.Builder
	exited := make(chan error, 1)
	go func() {
		exited <- run(ctx, []string{"stub-origin",
			"--listen", "127.0.0.1:0", "--authorities", "3",
			"--profile", "../../testdata/profiles/throttling.json",
			"--urls-file", urlsFile,
		}, func(k string) string {
			// The environment fills flags not given on the command line.
			if k == "MIRRORWORKER_ADMIN_LISTEN" {
				return "127.0.0.1:0"
			}
			return ""
		}, strings.NewReader(""), outW, &lockedWriter{w: &stderr})
		outW.Close()
	}()

	// stdout: one base URL a line, printed once every listener is bound.
	sc := bufio.NewScanner(outR)
	var printed []string
	for len(printed) < 3 && sc.Scan() {
		printed = append(printed, sc.Text())
	}
	go io.Copy(io.Discard, outR)
	if len(printed) != 3 {
		t.Fatalf("printed %q, want 3 URLs", printed)
	}
	b, err := os.ReadFile(urlsFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		URLs  []string `json:"urls"`
		Admin string   `json:"admin"`
	}
	if err := json.Unmarshal(b, &f); err != nil || len(f.URLs) != 3 || f.Admin == "" {
		t.Fatalf("urls file %s: %v", b, err)
	}
	for i, u := range printed {
		if f.URLs[i] != u || !strings.HasPrefix(u, "http://127.0.0.1:") {
			t.Fatalf("urls file %v, printed %v", f.URLs, printed)
		}
	}

	c := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	resp, err := c.Get(printed[2] + "/a/b?size=123")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != string(stuborigin.ObjectBytes("/a/b", 123)) || resp.Header.Get("RateLimit") == "" {
		t.Fatalf("GET: %d, %d bytes, RateLimit %q", resp.StatusCode, len(body), resp.Header.Get("RateLimit"))
	}
	resp, err = c.Get(f.Admin + "/stats?identities=0")
	if err != nil {
		t.Fatal(err)
	}
	var st stuborigin.Stats
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || len(st.Authorities) != 3 || st.Authorities[2].Admitted != 1 || st.Profile != "throttling" {
		t.Fatalf("stats %+v: %v", st, err)
	}

	cancel()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("run after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("stub-origin did not stop after cancel")
	}
	if _, err := c.Get(printed[0] + "/x"); err == nil {
		t.Fatal("still serving after shutdown")
	}
}

func TestStubOriginUsageErrors(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.json")
	os.WriteFile(bad, []byte(`{"quotas":{"anonymous":{"burst":{"capacity":0,"refill_per_second":1},"sustained":{"capacity":1,"window":"1s"}}}}`), 0o644)
	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantMsg  string
	}{
		{"no profile", []string{"--listen", "127.0.0.1:0"}, 2, "--profile is required"},
		{"invalid profile", []string{"--listen", "127.0.0.1:0", "--admin-listen", "", "--profile", bad}, 1, "quotas.anonymous.burst.capacity"},
		{"missing profile", []string{"--profile", filepath.Join(t.TempDir(), "nope.json")}, 1, "no such file"},
		{"bad listen", []string{"--listen", "nowhere", "--admin-listen", "", "--profile", "../../testdata/profiles/generous.json"}, 1, "listen"},
		{"log format", []string{"--log-format", "xml", "--profile", "../../testdata/profiles/generous.json"}, 2, "log format"},
		{"extra argument", []string{"--profile", "x.json", "extra"}, 2, "unexpected argument"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var stdout, stderr strings.Builder
			err := run(ctx, append([]string{"stub-origin"}, tt.args...), func(string) string { return "" }, strings.NewReader(""), &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Fatalf("error %v, want one mentioning %q", err, tt.wantMsg)
			}
			code := 1
			var ec exitCoder
			if errors.As(err, &ec) {
				code = ec.ExitCode()
			}
			if code != tt.wantCode {
				t.Fatalf("exit code %d, want %d", code, tt.wantCode)
			}
			if stdout.Len() != 0 {
				t.Fatalf("printed %q on a failed start", stdout.String())
			}
		})
	}
}

// lockedWriter serialises writes from the origin's goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestStubOriginServesALoadTestProfile: stub-origin takes a load-test
// profile as it is (the origin under "origin"), here the nginx-like one:
// six admitted at once (burst 5, nodelay), then 429 with the fixed
// Retry-After and no rate-limit header.
func TestStubOriginServesALoadTestProfile(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	outR, outW := io.Pipe()
	exited := make(chan error, 1)
	go func() {
		exited <- run(ctx, []string{"stub-origin", "--listen", "127.0.0.1:0", "--admin-listen", "",
			"--profile", "../../testdata/profiles/nginx-limit-req.json"},
			func(string) string { return "" }, strings.NewReader(""), outW, io.Discard)
		outW.Close()
	}()
	sc := bufio.NewScanner(outR)
	if !sc.Scan() {
		t.Fatalf("printed no URL: %v", <-exited)
	}
	base := sc.Text()
	go io.Copy(io.Discard, outR)
	c := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	// The bucket leaks 2 a second: on a slow machine a seventh may still
	// pass, so send until the first refusal.
	refused := false
	for n := 0; n < 20 && !refused; n++ {
		resp, err := c.Get(base + "/f")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			continue
		}
		if n < 6 || resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "2" || resp.Header.Get("RateLimit") != "" {
			t.Fatalf("after %d admitted: %d, Retry-After %q, RateLimit %q; want 6 or more, then 429 with Retry-After 2 and no RateLimit",
				n, resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("RateLimit"))
		}
		refused = true
	}
	if !refused {
		t.Fatal("20 requests at once, none refused by a 2 r/s bucket of burst 5")
	}
	cancel()
	if err := <-exited; err != nil {
		t.Fatalf("run after cancel: %v", err)
	}
}
