package bytesize_test

import (
	"errors"
	"testing"

	"github.com/mirrorworker/mirrorworker/bytesize"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		bad  bool
	}{
		{in: "0", want: 0},
		{in: "1500", want: 1500},
		{in: "16GiB", want: 16 << 30},
		{in: " 500 MB ", want: 500e6},
		{in: "4KiB", want: 4096},
		{in: "1B", want: 1},
		{in: "1 XB", bad: true},
		{in: "-1", bad: true},
		{in: "MiB", bad: true},
		{in: "9223372036854775807KiB", bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := bytesize.Parse(tt.in)
			if tt.bad {
				if !errors.Is(err, bytesize.ErrSyntax) {
					t.Fatalf("Parse(%q) = %d, %v; want ErrSyntax", tt.in, got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Parse(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestRateRoundTrip(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want int64
		out  string
	}{
		{in: "1MiB/s", want: 1 << 20, out: "1MiB/s"},
		{in: "1048576", want: 1 << 20, out: "1MiB/s"},
		{in: "500KB/s", want: 500e3, out: "500000/s"},
		{in: "0", want: 0, out: "0/s"},
		{in: "1536 /s", want: 1536, out: "1536/s"},
	} {
		got, err := bytesize.ParseRate(tt.in)
		if err != nil || got != tt.want {
			t.Fatalf("ParseRate(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
		if s := bytesize.FormatRate(got); s != tt.out {
			t.Errorf("FormatRate(%d) = %q, want %q", got, s, tt.out)
		}
		if back, err := bytesize.ParseRate(bytesize.FormatRate(got)); err != nil || back != got {
			t.Errorf("ParseRate(FormatRate(%d)) = %d, %v", got, back, err)
		}
	}
	if _, err := bytesize.ParseRate("1MiB/h"); !errors.Is(err, bytesize.ErrSyntax) {
		t.Errorf("ParseRate(1MiB/h): %v, want ErrSyntax", err)
	}
}

func TestApprox(t *testing.T) {
	tests := []struct {
		n    int64
		want string
	}{
		{0, "0 B"}, {1023, "1023 B"}, {1024, "1.0 KiB"}, {12_345, "12.1 KiB"},
		{3 << 20, "3.0 MiB"}, {312_000_000, "297.5 MiB"}, {1536 << 20, "1.5 GiB"}, {2 << 40, "2.0 TiB"},
	}
	for _, tt := range tests {
		if got := bytesize.Approx(tt.n); got != tt.want {
			t.Errorf("bytesize.Approx(%d) = %q, want %q", tt.n, got, tt.want)
		}
	}
}
