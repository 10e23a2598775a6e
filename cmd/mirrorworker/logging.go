package main

import (
	"fmt"
	"io"
	"time"

	"github.com/rs/zerolog"
)

// newLogger builds the process logger: JSON by default, human-readable with
// format "console". The logger is passed down; nothing logs globally.
func newLogger(w io.Writer, format, level string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		return zerolog.Nop(), fmt.Errorf("log level %q: want trace, debug, info, warn or error", level)
	}
	switch format {
	case "json", "":
	case "console":
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339}
	default:
		return zerolog.Nop(), fmt.Errorf("log format %q: want json or console", format)
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}
