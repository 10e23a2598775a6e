package main

import (
	"fmt"
	"io"
	"os"

	"github.com/rs/zerolog"
	"golang.org/x/term"
)

// logTimeFormat is RFC 3339 with milliseconds: two lines of one second
// stay apart, and the JSON and console forms read the same.
const logTimeFormat = "2006-01-02T15:04:05.000Z07:00"

// setLogFormats sets zerolog's process-wide formats, once, before anything
// logs: timestamps to the millisecond, and durations as Go duration strings
// ("1.5s", "10m0s") rather than bare numbers whose unit a reader must guess.
// zerolog offers these only as package settings; main and TestMain call
// this, nothing else changes them.
func setLogFormats() {
	zerolog.TimeFieldFormat = logTimeFormat
	zerolog.DurationFieldFormat = zerolog.DurationFormatString
}

// newLogger builds the process logger: JSON by default, human-readable with
// format "console", coloured only when w is a terminal (a file or a pipe
// gets no escape codes). Writes are serialised. The logger is passed down;
// nothing logs globally.
func newLogger(w io.Writer, format, level string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		return zerolog.Nop(), fmt.Errorf("log level %q: want trace, debug, info, warn or error", level)
	}
	colour := isTerminal(w)
	w = zerolog.SyncWriter(w)
	switch format {
	case "json", "":
	case "console":
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: logTimeFormat, NoColor: !colour}
	default:
		return zerolog.Nop(), fmt.Errorf("log format %q: want json or console", format)
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}

// isTerminal reports whether w is a terminal, where colour and a progress
// line rewritten in place make sense.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
