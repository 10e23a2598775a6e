package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/mirror/bucket"
	"github.com/mirrorworker/mirrorworker/pipeline"
	"github.com/mirrorworker/mirrorworker/worker"
)

// storeTarget is a mirror target the commands open from --target: a file
// tree (*mirror.FileTarget) or a bucket (*bucket.Target).
type storeTarget interface {
	worker.Target
	// Probe proves the target takes writes now (the worker's probe while
	// it is down).
	Probe(ctx context.Context) error
	// Root is where an operator finds the objects: a directory or
	// s3://BUCKET/PREFIX.
	Root() string
}

var (
	_ storeTarget = (*mirror.FileTarget)(nil)
	_ storeTarget = (*bucket.Target)(nil)
)

// targetHelp is the --target flag's help, for every command that has one.
const targetHelp = "mirror target: file:///abs/dir, a directory, or s3://BUCKET[/PREFIX] (with --s3-endpoint and --s3-region; credentials from the AWS chain)"

// targetFlags are the flags of the mirror target: a bucket's, for every
// command that opens a target, and how a file target makes objects
// durable, for the commands that store (registerSync).
type targetFlags struct {
	// sync is --target-sync: "auto", "file" or "filesystem"
	// (mirror.Options.SyncAuto, SyncFilesystem); "" where the command has
	// no such flag.
	sync          string
	endpoint      string
	region        string
	partSize      byteSize
	partsInFlight int
	memory        byteSize
	sweepAge      time.Duration
}

func (s *targetFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.endpoint, "s3-endpoint", "", "S3 API URL of an s3:// target (http://minio:9000, https://s3.example.net); empty: AWS S3 of --s3-region. Buckets are addressed path-style")
	fs.StringVar(&s.region, "s3-region", "", "region of an s3:// target; empty: the AWS configuration's (AWS_REGION), else "+bucket.DefaultRegion)
	s.partSize = bucket.DefaultPartSize
	fs.Var(&s.partSize, "s3-part-size", "part `size` of multipart uploads to an s3:// target, and the largest body stored in one PutObject (5MiB to 64MiB; an object may have 10,000 parts)")
	fs.IntVar(&s.partsInFlight, "s3-parts-in-flight", bucket.DefaultPartsInFlight, "parts of one multipart upload sent at once")
	s.memory = bucket.DefaultMemory
	fs.Var(&s.memory, "s3-memory", "`bytes` of part buffers all uploads to an s3:// target hold at once (raised to part size x (parts in flight + 1))")
	fs.DurationVar(&s.sweepAge, "s3-sweep-older-than", 0, "at start-up, abort the multipart uploads under the target's prefix started more than this long ago (a killed pod's); 0: every one, which fails (and retries) uploads other pods have under way")
}

// Values of --target-sync.
const (
	syncAuto       = "auto"
	syncFile       = "file"
	syncFilesystem = "filesystem"
)

// registerSync registers --target-sync, for the commands that store.
func (s *targetFlags) registerSync(fs *flag.FlagSet) {
	fs.StringVar(&s.sync, "target-sync", syncAuto, "how a file target makes each object durable: file (fsync the object, then its directory), filesystem (one syncfs(2) of the target's file system, shared by the objects stored at that moment: far fewer device flushes, but it flushes every program's writes to that file system, so give the target a file system of its own; Linux only) or auto (filesystem where the target directory is a local disk's whole file system, mounted there and nowhere else, on Linux 5.8 or later; file anywhere else)")
}

// check reports flag values that cannot work.
func (s *targetFlags) check(bad func(format string, a ...any)) {
	if s.sync != "" && s.sync != syncAuto && s.sync != syncFile && s.sync != syncFilesystem {
		bad("--target-sync %q: want %s, %s or %s", s.sync, syncAuto, syncFile, syncFilesystem)
	}
	if s.partSize < bucket.MinPartSize || s.partSize > bucket.MaxPartSize {
		bad("--s3-part-size %d: want 5MiB to 64MiB", s.partSize)
	}
	if s.partsInFlight < 1 {
		bad("--s3-parts-in-flight %d: want at least 1", s.partsInFlight)
	}
	if s.memory < 0 {
		bad("--s3-memory %d: want 0 or more", s.memory)
	}
	if s.sweepAge < 0 {
		bad("--s3-sweep-older-than %s: want 0 or more", s.sweepAge)
	}
}

// isBucketSpec reports a target spec that names a bucket.
func isBucketSpec(spec string) bool { return strings.HasPrefix(spec, bucket.Scheme+"://") }

// openTarget opens the mirror target at spec and proves it writable (a
// file target) or reachable (a bucket), so that a mistake fails before
// anything starts rather than at the first job. hook, the test hooks'
// fault (nil: none), may kill the process at a step of the target's Put
// (crash tests).
func (s *targetFlags) openTarget(ctx context.Context, spec string, hook func(string), log zerolog.Logger) (storeTarget, error) {
	if isBucketSpec(spec) {
		if s.sync == syncFilesystem {
			log.Warn().Str("target", spec).Msg("--target-sync filesystem is ignored: the target is a bucket, whose writes are durable when it answers")
		}
		octx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		t, err := bucket.Open(octx, spec, &bucket.Options{
			Endpoint:       s.endpoint,
			Region:         s.region,
			PartSize:       int64(s.partSize),
			PartsInFlight:  s.partsInFlight,
			Memory:         int64(s.memory),
			SweepOlderThan: s.sweepAge,
			Logger:         log.With().Str("component", "target").Logger(),
			FaultHook:      hook,
		})
		if err != nil {
			return nil, fmt.Errorf("%w (pass --target, --s3-endpoint, --s3-region; credentials come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE or web identity)", err)
		}
		return t, nil
	}
	if s.endpoint != "" {
		log.Warn().Str("target", spec).Msg("--s3-endpoint is ignored: the target is not s3://")
	}
	target, err := pipeline.OpenTargetWith(spec, &mirror.Options{FaultHook: hook, SyncFilesystem: s.sync == syncFilesystem, SyncAuto: s.sync == syncAuto})
	if err != nil {
		return nil, fmt.Errorf("%w (pass --target)", err)
	}
	if s.sync == syncAuto {
		logSyncMode(log, target)
	}
	if s.sync != "" && target.MetadataTakesABlock() {
		log.Info().Str("target", target.Root()).Msg(attrBlockMsg)
	}
	return target, nil
}

// The lines logSyncMode writes.
const (
	syncSharedMsg = "objects are made durable together, by syncfs calls of the target's file system (--target-sync auto: the target is a file system of its own; --target-sync file fsyncs each object instead)"
	syncEachMsg   = "each object is made durable by an fsync of its own and one of its directory (--target-sync auto: the target is not a file system of its own; mount one there, or pass --target-sync filesystem, to share one syncfs among many objects)"
)

// attrBlockMsg is said at start where the file system keeps an object's
// metadata attribute in a block of its own (mirror.FileTarget.MetadataTakesABlock).
const attrBlockMsg = "each object's metadata attribute takes a block of its own on the target's file system, one more to allocate, write and flush per object; on ext4, a file system made with 1024-byte inodes (mkfs.ext4 -I 1024) keeps it in the inode (README, sizing)"

// logSyncMode says, at start, how --target-sync auto makes the target's
// objects durable and what it found that decided it.
func logSyncMode(log zerolog.Logger, t *mirror.FileTarget) {
	msg := syncEachMsg
	whole, why := t.SyncMode()
	if whole {
		msg = syncSharedMsg
	}
	log.Info().Str("target", t.Root()).Str("found", why).Msg(msg)
}
