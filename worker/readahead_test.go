package worker

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

// closeRecorder is a body that records when it is closed.
type closeRecorder struct {
	io.Reader
	closed bool
}

func (c *closeRecorder) Close() error { c.closed = true; return nil }

func TestReadAheadEndsASmallRequestBeforeTheTarget(t *testing.T) {
	data := bytes.Repeat([]byte("m"), ReadAheadSize-1)
	// OneByteReader: the body arrives in many small reads, as from a socket.
	rec := &closeRecorder{Reader: iotest.OneByteReader(bytes.NewReader(data))}
	body := &countingReader{r: rec}
	src, done := readAhead(body)
	defer done()
	if !rec.closed {
		t.Fatal("a body smaller than ReadAheadSize is not closed (its request not done) before the target reads it")
	}
	got, err := io.ReadAll(src)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, err %v; want the %d bytes of the body", len(got), err, len(data))
	}
	if body.n != int64(len(data)) || body.err != nil {
		t.Fatalf("counted %d bytes, err %v", body.n, body.err)
	}
}

func TestReadAheadStreamsALargeBody(t *testing.T) {
	data := make([]byte, 3*ReadAheadSize+17)
	for i := range data {
		data[i] = byte(i * 7)
	}
	rec := &closeRecorder{Reader: bytes.NewReader(data)}
	body := &countingReader{r: rec}
	src, done := readAhead(body)
	defer done()
	if rec.closed {
		t.Fatal("a body larger than ReadAheadSize was read whole before the target")
	}
	if body.n != ReadAheadSize {
		t.Fatalf("read ahead %d bytes, want %d", body.n, ReadAheadSize)
	}
	got, err := io.ReadAll(src)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, err %v; want the %d bytes of the body", len(got), err, len(data))
	}
	if !rec.closed {
		t.Fatal("the body is not closed at its end")
	}
}

func TestReadAheadKeepsATruncatedBodysError(t *testing.T) {
	// A transfer cut short: io.ErrUnexpectedEOF from the body itself must
	// reach the target as an error, never as a short, complete body.
	for _, tc := range []struct {
		name string
		size int
	}{
		{"small", 10},
		{"exactly the buffer", ReadAheadSize},
		{"larger", ReadAheadSize + 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := io.MultiReader(bytes.NewReader(make([]byte, tc.size)), iotest.ErrReader(io.ErrUnexpectedEOF))
			body := &countingReader{r: &closeRecorder{Reader: r}}
			src, done := readAhead(body)
			defer done()
			got, err := io.ReadAll(src)
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("read %d bytes and err %v; want io.ErrUnexpectedEOF", len(got), err)
			}
			if len(got) != tc.size {
				t.Fatalf("read %d bytes before the error, want %d", len(got), tc.size)
			}
			if !errors.Is(body.err, io.ErrUnexpectedEOF) {
				t.Fatalf("countingReader err %v, want io.ErrUnexpectedEOF", body.err)
			}
		})
	}
}
