package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/mirrorworker/mirrorworker/bytesize"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/worker"
)

// writeFetches prints the fetches in flight of every pod, as each pod last
// wrote them (its UPDATED age above): what a long download has done so
// far. Nothing when no pod fetches.
func writeFetches(w io.Writer, pods []worker.PodStatus) error {
	n := 0
	for _, ps := range pods {
		n += len(ps.Fetches)
	}
	if n == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw)
	// The URL last: mirrors' URLs are long, and the figures stay aligned
	// beside their header whatever their length.
	fmt.Fprintln(tw, "RECEIVED\tAVG RATE\tELAPSED\tETA\tPOD\tFETCHING")
	for _, ps := range pods {
		for _, f := range ps.Fetches {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", received(f), rate(f), secs(f.Elapsed), eta(f), ps.Pod, f.URL)
		}
	}
	return tw.Flush()
}

// received is "120.0 MiB of 500.0 MiB (24%)", or the bytes alone when the
// size is not known (yet).
func received(f fetch.Progress) string {
	s := bytesize.Approx(f.Bytes)
	if f.Expected > 0 {
		s += fmt.Sprintf(" of %s (%d%%)", bytesize.Approx(f.Expected), f.Bytes*100/f.Expected)
	}
	return s
}

func rate(f fetch.Progress) string {
	if f.Rate <= 0 {
		return "-"
	}
	return bytesize.Approx(int64(f.Rate)) + "/s"
}

// eta is the time left at the rate so far; "-" when it cannot be told.
func eta(f fetch.Progress) string {
	if f.Expected <= 0 || f.Rate <= 0 || f.Bytes >= f.Expected {
		return "-"
	}
	return secs(float64(f.Expected-f.Bytes) / f.Rate)
}

func secs(s float64) string {
	return (time.Duration(s * float64(time.Second))).Round(time.Second).String()
}
