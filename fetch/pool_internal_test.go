package fetch

import "testing"

func TestPoolLimit(t *testing.T) {
	for _, c := range []struct {
		name              string
		want, files, pool int
	}{
		{name: "limit unknown", want: 16384, files: 0, pool: 16384},
		{name: "large limit", want: 16384, files: 1 << 20, pool: 16384},
		{name: "limit less a reserve", want: 16384, files: 20000, pool: 16384},
		{name: "half a small limit", want: 16384, files: 1024, pool: 512},
		{name: "reserve beats half", want: 16384, files: 4096, pool: 3072},
		{name: "tiny limit", want: 16384, files: 1, pool: 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := poolLimit(c.want, c.files); got != c.pool {
				t.Errorf("poolLimit(%d, %d) = %d, want %d", c.want, c.files, got, c.pool)
			}
		})
	}
}
