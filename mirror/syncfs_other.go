//go:build !linux

package mirror

import (
	"errors"
	"fmt"
)

// syncFilesystem is syncfs(2), which only Linux has.
func syncFilesystem(dir string) error {
	return fmt.Errorf("syncfs %s: %w", dir, errors.ErrUnsupported)
}
