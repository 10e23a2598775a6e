package stuborigin

import (
	"testing"
	"time"
)

func TestNetworkOf(t *testing.T) {
	tests := []struct {
		a, b string
		same bool
	}{
		{"192.0.2.1:1000", "192.0.2.254:2000", true},
		{"192.0.2.1:1000", "192.0.3.1:1000", false},
		{"[::ffff:192.0.2.1]:1000", "192.0.2.9:1000", true},            // IPv4-mapped is IPv4
		{"[2001:db8:0:ff00::1]:443", "[2001:db8:0:ffff::2]:443", true}, // one /56
		{"[2001:db8:0:ff00::1]:443", "[2001:db8:0:100::1]:443", false},
		{"[fe80::1%eth0]:443", "[fe80::2%eth1]:443", true},
	}
	for _, tt := range tests {
		t.Run(tt.a+" "+tt.b, func(t *testing.T) {
			pa, pb := networkOf(tt.a), networkOf(tt.b)
			if !pa.IsValid() || !pb.IsValid() {
				t.Fatalf("invalid prefixes %v %v", pa, pb)
			}
			if (pa == pb) != tt.same {
				t.Fatalf("%v vs %v: same=%v, want %v", pa, pb, pa == pb, tt.same)
			}
		})
	}
}

// The bucket's arithmetic on virtual instants, x/time/rate style.
func TestBucket(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := bucketSpec{capacity: 3, interval: time.Second}
	var b bucket
	for i := range 3 {
		if w := b.wait(s, t0); w != 0 {
			t.Fatalf("token %d: wait %v", i, w)
		}
		b.take(s, t0)
	}
	steps := []struct {
		at        time.Duration
		wait      time.Duration
		remaining int64
		reset     time.Duration
	}{
		{0, time.Second, 0, time.Second},
		{400 * time.Millisecond, 600 * time.Millisecond, 0, 600 * time.Millisecond},
		{time.Second, 0, 1, 2 * time.Second},
		{2500 * time.Millisecond, 0, 2, 500 * time.Millisecond},
		{3 * time.Second, 0, 3, 0},
		{time.Hour, 0, 3, 0},
	}
	for _, st := range steps {
		now := t0.Add(st.at)
		if w, r, rs := b.wait(s, now), b.remaining(s, now), b.reset(s, now); w != st.wait || r != st.remaining || rs != st.reset {
			t.Errorf("at %v: wait %v remaining %d reset %v, want %v %d %v", st.at, w, r, rs, st.wait, st.remaining, st.reset)
		}
	}
}
