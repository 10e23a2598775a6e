package main

import (
	"context"
	"errors"
	"io"
)

// cmdLoadtest is not built yet: see issue 6. The file that implements it replaces this one.
func cmdLoadtest(_ context.Context, _ []string, _ func(string) string, _ io.Reader, _, _ io.Writer) error {
	return errors.New("loadtest: not implemented yet (issue 6)")
}
