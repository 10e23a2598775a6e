package main

import (
	"context"
	"errors"
	"io"
)

// cmdReplay is not built yet: see issue 7. The file that implements it replaces this one.
func cmdReplay(_ context.Context, _ []string, _ func(string) string, _ io.Reader, _, _ io.Writer) error {
	return errors.New("replay: not implemented yet (issue 7)")
}
