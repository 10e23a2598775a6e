package main

import (
	"context"
	"errors"
	"io"
)

// cmdStubOrigin is not built yet: see issue 5. The file that implements it replaces this one.
func cmdStubOrigin(_ context.Context, _ []string, _ func(string) string, _ io.Reader, _, _ io.Writer) error {
	return errors.New("stub-origin: not implemented yet (issue 5)")
}
