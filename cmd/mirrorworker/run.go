package main

import (
	"context"
	"errors"
	"io"
)

// cmdRun is not built yet: see issue 2. The file that implements it replaces this one.
func cmdRun(_ context.Context, _ []string, _ func(string) string, _ io.Reader, _, _ io.Writer) error {
	return errors.New("run: not implemented yet (issue 2)")
}
