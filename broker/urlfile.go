package broker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ClientURLFile is the file in a worker's data directory that holds the
// client URL of its embedded NATS server while it runs, so that commands
// given the same --data-dir reach that worker and no other.
const ClientURLFile = "nats-client.url"

// StoreLockFile is the file in a worker's data directory that the worker
// running its embedded NATS server there holds locked (package dirlock),
// with its pid and addresses, so that a second one fails at once instead
// of opening the same store.
const StoreLockFile = "mirrorworker.lock"

// ErrNoClientURL is returned by ReadClientURL when the data directory holds
// no client URL: no worker with an embedded server runs there.
var ErrNoClientURL = errors.New("no running worker with an embedded NATS server")

// WriteClientURL writes url into dataDir's ClientURLFile (atomically, so
// that a reader never sees half of it) and returns the function that removes
// it again, unless another worker has replaced it meanwhile.
func WriteClientURL(dataDir, url string) (remove func(), err error) {
	path := filepath.Join(dataDir, ClientURLFile)
	tmp, err := os.CreateTemp(dataDir, ClientURLFile+".*")
	if err != nil {
		return nil, fmt.Errorf("write client url: %w", err)
	}
	_, werr := tmp.WriteString(url + "\n")
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp.Name())
		return nil, fmt.Errorf("write client url: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return nil, fmt.Errorf("write client url: %w", err)
	}
	return func() {
		if got, err := ReadClientURL(dataDir); err == nil && got == url {
			os.Remove(path)
		}
	}, nil
}

// ReadClientURL returns the client URL a worker running on dataDir wrote,
// or an error wrapping ErrNoClientURL when there is none.
func ReadClientURL(dataDir string) (string, error) {
	path := filepath.Join(dataDir, ClientURLFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("%w in %s (%s not found)", ErrNoClientURL, dataDir, path)
	}
	if err != nil {
		return "", fmt.Errorf("read client url: %w", err)
	}
	u := strings.TrimSpace(string(b))
	if u == "" {
		return "", fmt.Errorf("%w in %s (%s is empty)", ErrNoClientURL, dataDir, path)
	}
	return u, nil
}
