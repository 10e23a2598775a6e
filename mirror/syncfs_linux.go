package mirror

import (
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// syncFilesystem makes every change to the file system that holds dir
// durable (syncfs(2): its dirty data and metadata written, the device's
// cache flushed; since Linux 5.8 it reports a write-back error any of them
// met).
func syncFilesystem(dir string) error {
	fd, err := openRetry(dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("syncfs: open %s: %w", dir, err)
	}
	for {
		if err = unix.Syncfs(fd); err != syscall.EINTR {
			break
		}
	}
	syscall.Close(fd)
	if err != nil {
		return fmt.Errorf("syncfs %s: %w", dir, err)
	}
	return nil
}
