package stuborigin

import (
	"testing"
	"time"
)

// TestGapsAreBetweenArrivalsInTheirOrder: the gaps are counted between
// arrivals in the order the kernel received them, though admit sees them
// in the order the handlers ran. On a loaded machine a handler can run
// after the next request's: two requests that arrived a floor and more
// apart, admitted in the other order, are no gap below the floor (it
// would be a negative gap), while two that arrived closer still are one.
func TestGapsAreBetweenArrivalsInTheirOrder(t *testing.T) {
	const floor = 100 * time.Millisecond
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	tests := []struct {
		name string
		// arrivals in the order admit sees them (the handlers' order),
		// in ms since t0.
		arrivals []int
		want     Gaps
	}{
		{"in order", []int{0, 102, 204, 306},
			Gaps{GapCount: 3, MinGap: 102 * time.Millisecond}},
		{"two handled the other way round", []int{0, 204, 102, 306},
			Gaps{GapCount: 3, MinGap: 102 * time.Millisecond}},
		{"the first handled last", []int{102, 204, 0, 306},
			Gaps{GapCount: 3, MinGap: 102 * time.Millisecond}},
		{"a late handler between a close pair", []int{0, 150, 100, 300},
			Gaps{GapCount: 3, MinGap: 50 * time.Millisecond, BelowFloor: 1}},
		{"a close pair in order", []int{0, 102, 150, 300},
			Gaps{GapCount: 3, MinGap: 48 * time.Millisecond, BelowFloor: 1}},
		{"late by more than the window keeps", []int{0, 300, 400, 500, 600, 700, 800, 900, 1000, 1100, 200},
			Gaps{GapCount: 10, MinGap: 100 * time.Millisecond}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			og, err := New(&Profile{Name: "t", LimitReq: &LimitReq{Rate: 1000, Burst: 1000, NoDelay: true}}, &Options{GapFloor: floor})
			if err != nil {
				t.Fatal(err)
			}
			s := og.shards[0]
			c := caller{key: "k", group: "k", kind: "anonymous", quota: og.quotas["anonymous"]}
			for _, ms := range tt.arrivals {
				s.admit(at(ms), at(ms), c, false, "")
			}
			st := s.stats(true, at(2000))
			if st.Gaps != tt.want {
				t.Errorf("authority gaps %+v, want %+v", st.Gaps, tt.want)
			}
			if len(st.Identities) != 1 || st.Identities[0].Gaps != tt.want {
				t.Errorf("identity gaps %+v, want %+v", st.Identities, tt.want)
			}
		})
	}
}
