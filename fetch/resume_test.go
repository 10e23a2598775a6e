package fetch_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/fetch"
)

// TestResumeRange asks for the rest of a body from byte From on with
// If-Range, from real loopback origins that honour the range, ignore it,
// hold another version of the object, or answer a Content-Range other
// than the one asked for: only the rest of the same body comes back with
// an Offset; anything else comes whole, or fails ErrRangeMismatch before
// a byte of the body is read.
func TestResumeRange(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
	const from = 60000
	serve := func(etag string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("ETag", etag)
			http.ServeContent(w, r, "obj", time.Time{}, bytes.NewReader(data))
		}
	}
	tests := []struct {
		name       string
		handler    http.HandlerFunc
		ifRange    string
		size       int64 // the job's size; 0: none
		wantStatus int
		wantOffset int64
		wantErr    error
		wantRange  bool // the request carried Range
	}{
		{name: "honoured", handler: serve(`"v1"`), ifRange: `"v1"`, size: int64(len(data)),
			wantStatus: 206, wantOffset: from, wantRange: true},
		{name: "honoured, no size", handler: serve(`"v1"`), ifRange: `"v1"`,
			wantStatus: 206, wantOffset: from, wantRange: true},
		{name: "changed object", handler: serve(`"v2"`), ifRange: `"v1"`, size: int64(len(data)),
			wantStatus: 200, wantRange: true},
		{name: "no validator: no range", handler: serve(`"v1"`), size: int64(len(data)),
			wantStatus: 200},
		{name: "range ignored", handler: func(w http.ResponseWriter, r *http.Request) {
			w.Write(data)
		}, ifRange: `"v1"`, size: int64(len(data)), wantStatus: 200, wantRange: true},
		{name: "another start", handler: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Range", "bytes 100-"+strconv.Itoa(len(data)-1)+"/"+strconv.Itoa(len(data)))
			w.WriteHeader(206)
			w.Write(data[100:])
		}, ifRange: `"v1"`, wantErr: fetch.ErrRangeMismatch, wantRange: true},
		{name: "short of the end", handler: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Range", "bytes "+strconv.Itoa(from)+"-60999/"+strconv.Itoa(len(data)))
			w.WriteHeader(206)
			w.Write(data[from:61000])
		}, ifRange: `"v1"`, wantErr: fetch.ErrRangeMismatch, wantRange: true},
		{name: "another total than the job's", handler: serve(`"v1"`), ifRange: `"v1"`, size: int64(len(data)) + 1,
			wantErr: fetch.ErrRangeMismatch, wantRange: true},
		{name: "unknown length", handler: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Range", "bytes "+strconv.Itoa(from)+"-"+strconv.Itoa(len(data)-1)+"/*")
			w.WriteHeader(206)
			w.Write(data[from:])
		}, ifRange: `"v1"`, wantErr: fetch.ErrRangeMismatch, wantRange: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var gotRange, gotIfRange string
			o := newOrigin(t, func(w http.ResponseWriter, r *http.Request) {
				gotRange, gotIfRange = r.Header.Get("Range"), r.Header.Get("If-Range")
				tc.handler(w, r)
			})
			c := fetch.New(&fetch.Options{AllowPrivate: true})
			req := fetch.Request{URL: o.URL + "/obj", From: from, IfRange: tc.ifRange, Size: tc.size, HasSize: tc.size > 0}
			resp, err := c.Do(context.Background(), req, nil)
			if (gotRange != "") != tc.wantRange {
				t.Errorf("Range %q If-Range %q; want a range: %v", gotRange, gotIfRange, tc.wantRange)
			}
			if tc.wantRange && gotIfRange != tc.ifRange {
				t.Errorf("If-Range %q, want %q", gotIfRange, tc.ifRange)
			}
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Do: %v, want %v", err, tc.wantErr)
				}
				if got := fetch.ReasonCode(err, 0); got != "range_mismatch" {
					t.Errorf("ReasonCode %q, want range_mismatch", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("Do: %v", err)
			}
			defer resp.Body.Close()
			if resp.Status != tc.wantStatus || resp.Offset != tc.wantOffset {
				t.Fatalf("status %d offset %d, want %d offset %d", resp.Status, resp.Offset, tc.wantStatus, tc.wantOffset)
			}
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			if !bytes.Equal(body, data[resp.Offset:]) {
				t.Errorf("body of %d bytes is not the body from byte %d", len(body), resp.Offset)
			}
		})
	}
}
