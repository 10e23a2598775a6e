// Package buckettest runs a real S3-compatible server for a test:
// versitygw (Apache-2.0) with its posix backend, as a subprocess on a free
// 127.0.0.1 port, its objects plain files in a directory of the test's
// own.
//
// The server binary is built once from the pinned module (go install
// Module@Version) into os.UserCacheDir()/mirrorworker-test/versitygw-
// <Version>/, shared by every test binary and run (internal/testbin). It
// is not embedded in the test process: its posix backend changes the
// working directory and allows one instance per process.
//
// It is for tests only.
package buckettest

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/mirrorworker/mirrorworker/internal/testbin"
)

// Module and Version are the versitygw command the tests run.
const (
	Module  = "github.com/versity/versitygw/cmd/versitygw"
	Version = "v1.7.0"
)

// The root credentials and region of every test server.
const (
	AccessKey = "mirrorworker-test"
	SecretKey = "mirrorworker-test-secret"
	Region    = "us-east-1"
)

// Binary returns the path of the versitygw binary, building it on first
// use (about a minute and a half on two cores; later runs find it).
func Binary(t testing.TB) string {
	t.Helper()
	return testbin.Binary(t, testbin.Program{Name: "versitygw", Package: Module, Module: "github.com/versity/versitygw", Version: Version})
}

// Server is one versitygw process.
type Server struct {
	// Endpoint is the S3 API's URL, http://127.0.0.1:PORT.
	Endpoint string
	// Root is the posix backend's directory: each bucket a directory,
	// each object a file.
	Root string

	t    testing.TB
	bin  string
	addr string

	mu     sync.Mutex
	cmd    *exec.Cmd
	out    *syncBuffer
	exited chan struct{}
}

// syncBuffer is the server's output, written by exec's copier while a
// test may read it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Start starts a server on a free port with an empty root of the test's
// own, and kills it when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{t: t, bin: Binary(t), Root: t.TempDir()}
	var err error
	for range 3 { // the free port may be taken in between: try another
		s.addr = fmt.Sprintf("127.0.0.1:%d", testbin.FreePorts(t, 1)[0])
		s.Endpoint = "http://" + s.addr
		if err = s.start(); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) start() error {
	cmd := exec.Command(s.bin, "--port", s.addr, "--quiet", "posix", s.Root)
	cmd.Dir = s.Root
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY="+AccessKey, "ROOT_SECRET_KEY="+SecretKey, "VGW_REGION="+Region)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("buckettest: start versitygw: %w", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	s.mu.Lock()
	s.cmd, s.out, s.exited = cmd, out, exited
	s.mu.Unlock()
	// Up when it answers HTTP (403 to an unsigned request).
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		resp, err := client.Get(s.Endpoint + "/")
		if err == nil {
			resp.Body.Close()
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("buckettest: versitygw on %s exited at start-up:\n%s", s.addr, out.String())
		case <-tick.C:
		}
	}
	s.kill()
	return fmt.Errorf("buckettest: versitygw on %s not answering after 30s:\n%s", s.addr, out.String())
}

// Stop kills the server (SIGKILL) and waits for it to exit; the root
// stays. Stopping a stopped server does nothing.
func (s *Server) Stop() { s.kill() }

func (s *Server) kill() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// Restart starts the server again on the same port and root, after Stop.
func (s *Server) Restart() {
	s.t.Helper()
	s.kill()
	var err error
	// The port was ours a moment ago; a retry covers a slow release.
	for range 5 {
		if err = s.start(); err == nil {
			return
		}
	}
	s.t.Fatal(err)
}

// Env is the environment a mirrorworker process needs to reach the
// server through the standard AWS chain, and never anything else (no
// instance metadata lookups).
func (s *Server) Env() []string {
	return []string{
		"AWS_ACCESS_KEY_ID=" + AccessKey,
		"AWS_SECRET_ACCESS_KEY=" + SecretKey,
		"AWS_REGION=" + Region,
		"AWS_EC2_METADATA_DISABLED=true",
		"AWS_CONFIG_FILE=" + os.DevNull,
		"AWS_SHARED_CREDENTIALS_FILE=" + os.DevNull,
	}
}

// Credentials are the server's root credentials.
func Credentials() aws.CredentialsProvider {
	return credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, "")
}

// Client returns an S3 client of the server, path-style, with the root
// credentials and no default checksums, for the tests' own looks.
func (s *Server) Client() *s3.Client {
	return s3.New(s3.Options{
		Region:                     Region,
		BaseEndpoint:               aws.String(s.Endpoint),
		UsePathStyle:               true,
		Credentials:                Credentials(),
		RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
		ResponseChecksumValidation: aws.ResponseChecksumValidationWhenRequired,
	})
}

// CreateBucket creates a bucket.
func (s *Server) CreateBucket(t testing.TB, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.Client().CreateBucket(ctx, &s3.CreateBucketInput{Bucket: &name}); err != nil {
		t.Fatalf("create bucket %s: %v", name, err)
	}
}

// Output returns what the server has written since it last started.
func (s *Server) Output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.out == nil {
		return ""
	}
	return s.out.String()
}
