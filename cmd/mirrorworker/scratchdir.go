package main

import (
	"errors"
	"fmt"
	"os"
)

// checkScratchDir reports a --scratch-dir that is not an existing
// directory, before any strategy runs: each one would fail on it and the
// report would show only rows of "error". "" (the system temp dir) is fine.
func checkScratchDir(dir string) error {
	if dir == "" {
		return nil
	}
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("--scratch-dir %s: no such directory (create it first: mkdir -p %s)", dir, dir)
	case err != nil:
		return fmt.Errorf("--scratch-dir: %w", err)
	case !fi.IsDir():
		return fmt.Errorf("--scratch-dir %s: not a directory", dir)
	}
	return nil
}
