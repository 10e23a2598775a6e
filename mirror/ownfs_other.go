//go:build !linux

package mirror

// ownFileSystem: syncfs(2) is Linux's, so elsewhere no root is one the
// target may sync whole.
func ownFileSystem(string) (bool, string) { return false, "syncfs(2) is Linux only" }
