package dirlock_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/mirrorworker/mirrorworker/dirlock"
)

// flock locks belong to an open file, so two opens in one process
// exclude each other as two processes do.
func TestExclusive(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	first, err := dirlock.Exclusive(path, dirlock.Holder{PID: 42})
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Record(dirlock.Holder{PID: 42, NATSURL: "nats://127.0.0.1:4222", AdminURL: "http://127.0.0.1:9090"}); err != nil {
		t.Fatal(err)
	}
	_, err = dirlock.Exclusive(path, dirlock.Holder{PID: 43})
	var held *dirlock.HeldError
	if !errors.As(err, &held) {
		t.Fatalf("second Exclusive: %v, want a *HeldError", err)
	}
	want := dirlock.Holder{PID: 42, NATSURL: "nats://127.0.0.1:4222", AdminURL: "http://127.0.0.1:9090"}
	if held.Holder != want {
		t.Errorf("holder %+v, want %+v", held.Holder, want)
	}
	if err := first.Release(); err != nil {
		t.Fatal(err)
	}
	second, err := dirlock.Exclusive(path, dirlock.Holder{PID: 43})
	if err != nil {
		t.Fatalf("Exclusive after Release: %v", err)
	}
	defer second.Release()
	if h, err := dirlock.Read(path); err != nil || h != (dirlock.Holder{PID: 43}) {
		t.Errorf("record after the second took it: %+v, %v", h, err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("lock file: %v", err)
	}
}

func TestReleaseNil(t *testing.T) {
	var l *dirlock.Lock
	if err := l.Release(); err != nil {
		t.Errorf("nil Release: %v", err)
	}
}

func TestHeld(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	if _, held, err := dirlock.Held(path); held || err != nil {
		t.Fatalf("no file: held %v, %v", held, err)
	}
	l, err := dirlock.Exclusive(path, dirlock.Holder{PID: 7, AdminURL: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	if h, held, err := dirlock.Held(path); !held || err != nil || h.PID != 7 {
		t.Fatalf("held: %+v %v %v", h, held, err)
	}
	l.Release()
	if _, held, err := dirlock.Held(path); held || err != nil {
		t.Fatalf("released: held %v, %v", held, err)
	}
	// Held took no lock and wrote nothing: the next holder gets it.
	l, err = dirlock.Exclusive(path, dirlock.Holder{PID: 8})
	if err != nil {
		t.Fatalf("Exclusive after Held: %v", err)
	}
	l.Release()
}
