package jobs

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The cluster layout (docs/adr/0007): MIRROR_JOBS stays the clean log of
// submitted jobs. MIRROR_WORK sources it through a subject transform that
// puts each job in one of a fixed number of partitions by its authority, so
// that every authority's jobs go to exactly one partition consumer and so to
// the one pod that holds that partition's lease. MIRROR_PARKED holds the
// jobs of authorities that cannot take them for a long while, outside any
// consumer. MIRROR_LEASES holds the partition leases and MIRROR_PODS one
// entry per live pod (its status).
const (
	WorkStream   = "MIRROR_WORK"   // subjects mirror.work.<partition>.<tenant>.<akey>
	ParkStream   = "MIRROR_PARKED" // subjects mirror.parked.<partition>.<tenant>.<akey>
	LeasesBucket = "MIRROR_LEASES" // KV: partition -> owning pod, expiring
	PodsBucket   = "MIRROR_PODS"   // KV: pod id -> status, expiring

	WorkSubjectPrefix = "mirror.work."
	ParkSubjectPrefix = "mirror.parked."

	// PartitionConsumerPrefix names the durable consumer of one partition
	// on MIRROR_WORK: mirrorworker-p<NN>.
	PartitionConsumerPrefix = ConsumerName + "-p"
)

// Cluster defaults.
const (
	// DefaultPartitions is how many partitions MIRROR_WORK has. It bounds
	// how many pods can share the work (each pod serves whole partitions)
	// and is fixed when MIRROR_WORK is created.
	DefaultPartitions = 32
	MaxPartitions     = 1024
	// DefaultLeaseTTL is how long a partition lease lives without renewal;
	// a killed pod's partitions move after at most this long.
	DefaultLeaseTTL = 6 * time.Second
)

// Headers mirrorworker sets on messages it moves between its streams.
const (
	// HeaderDeliveries carries the deliveries a job had before it was
	// parked, so deliveries per job are counted across parking.
	HeaderDeliveries = "Mirror-Deliveries"
	// HeaderParkedAt is when a job was parked (RFC 3339), for diagnosis.
	HeaderParkedAt = "Mirror-Parked-At"
	// HeaderUnparked marks a job brought back from MIRROR_PARKED.
	HeaderUnparked = "Mirror-Unparked"
	// HeaderPod names the pod that published a pacer fact, so that pods
	// following MIRROR_EVENTS skip their own.
	HeaderPod = "Mirror-Pod"
)

// MinServerVersion is the oldest nats-server the cluster layout works with:
// stream sources with subject transforms and the partition() mapping.
const MinServerVersion = "2.10.0"

// Partition returns the partition of an authority key among n, the same
// value nats-server's {{partition(n,2)}} mapping gives the job's subject
// (FNV-1a 32 of the akey token, modulo n).
func Partition(akey string, n int) int {
	if n <= 1 {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(akey))
	return int(h.Sum32() % uint32(n))
}

// WorkSubject returns mirror.work.<p>.<tenant>.<akey>.
func WorkSubject(p int, tenant, akey string) string {
	return WorkSubjectPrefix + strconv.Itoa(p) + "." + tenant + "." + akey
}

// PartitionFilter returns the subject filter of partition p on MIRROR_WORK.
func PartitionFilter(p int) string { return WorkSubjectPrefix + strconv.Itoa(p) + ".>" }

// ParkSubject returns mirror.parked.<p>.<tenant>.<akey>.
func ParkSubject(p int, tenant, akey string) string {
	return ParkSubjectPrefix + strconv.Itoa(p) + "." + tenant + "." + akey
}

// ParkFilter returns the filter of one authority's parked jobs of every
// tenant in partition p; an empty akey selects the whole partition.
func ParkFilter(p int, akey string) string {
	if akey == "" {
		return ParkSubjectPrefix + strconv.Itoa(p) + ".>"
	}
	return ParkSubjectPrefix + strconv.Itoa(p) + ".*." + akey
}

// PartitionConsumer returns the durable name of partition p's consumer.
func PartitionConsumer(p int) string { return fmt.Sprintf("%s%02d", PartitionConsumerPrefix, p) }

// LeaseKey returns the MIRROR_LEASES key of partition p.
func LeaseKey(p int) string { return fmt.Sprintf("p%02d", p) }

// ParsePartitionSubject splits mirror.work.<p>.<tenant>.<akey> or
// mirror.parked.<p>.<tenant>.<akey>.
func ParsePartitionSubject(subject string) (p int, tenant, akey string, err error) {
	rest, ok := strings.CutPrefix(subject, WorkSubjectPrefix)
	if !ok {
		rest, ok = strings.CutPrefix(subject, ParkSubjectPrefix)
	}
	if !ok {
		return 0, "", "", invalid("subject", "%q is not a partition subject", truncate(subject, 300))
	}
	ps, rest, _ := strings.Cut(rest, ".")
	p, perr := strconv.Atoi(ps)
	tenant, akey, ok = strings.Cut(rest, ".")
	if perr != nil || p < 0 || !ok || !ValidTenant(tenant) || !validAkey(akey) {
		return 0, "", "", invalid("subject", "%q is not <prefix><partition>.<tenant>.<akey>", truncate(subject, 300))
	}
	return p, tenant, akey, nil
}

// WorkOptions configure the cluster layout. Zero fields mean the defaults.
type WorkOptions struct {
	Partitions int           // DefaultPartitions; fixed once MIRROR_WORK exists
	LeaseTTL   time.Duration // DefaultLeaseTTL
	Replicas   int           // of the streams and buckets; 0 means 1
	// ParkMaxBytes bounds MIRROR_PARKED; 0 is unlimited. A full parking
	// stream refuses a park, and the job is then deferred by NAK instead.
	ParkMaxBytes int64
}

func (o *WorkOptions) withDefaults() WorkOptions {
	var r WorkOptions
	if o != nil {
		r = *o
	}
	if r.Partitions <= 0 {
		r.Partitions = DefaultPartitions
	}
	if r.LeaseTTL <= 0 {
		r.LeaseTTL = DefaultLeaseTTL
	}
	if r.Replicas <= 0 {
		r.Replicas = 1
	}
	return r
}

var partitionRE = regexp.MustCompile(`\{\{\s*[pP]artition\((\d+),\s*2\)\s*\}\}`)

// transformDest is the subject transform of the MIRROR_JOBS source.
func transformDest(n int) string {
	return fmt.Sprintf("%s{{partition(%d,2)}}.{{wildcard(1)}}.{{wildcard(2)}}", WorkSubjectPrefix, n)
}

// WorkStreamConfig returns MIRROR_WORK's configuration: a work queue (a job
// leaves it when acked; MIRROR_JOBS keeps the log) sourcing MIRROR_JOBS from
// startSeq (0: from its first message).
func WorkStreamConfig(o *WorkOptions, startSeq uint64) jetstream.StreamConfig {
	r := o.withDefaults()
	src := &jetstream.StreamSource{
		Name: JobsStream,
		SubjectTransforms: []jetstream.SubjectTransformConfig{
			{Source: JobsSubjectPrefix + "*.*", Destination: transformDest(r.Partitions)},
		},
	}
	if startSeq > 1 {
		src.OptStartSeq = startSeq
	}
	return jetstream.StreamConfig{
		Name:        WorkStream,
		Description: fmt.Sprintf("mirrorworker jobs to do, in %d partitions by authority", r.Partitions),
		Subjects:    []string{WorkSubjectPrefix + ">"},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		MaxMsgs:     -1,
		MaxBytes:    -1,
		MaxMsgSize:  MaxJobLen,
		// Jobs brought back from parking carry no message id; sourced ones
		// were deduplicated by MIRROR_JOBS already.
		Duplicates: time.Second,
		Discard:    jetstream.DiscardNew,
		Sources:    []*jetstream.StreamSource{src},
		Replicas:   r.Replicas,
	}
}

// ParkStreamConfig returns MIRROR_PARKED's configuration. It has no age
// limit: a parked job is a job, and leaves only when brought back.
func ParkStreamConfig(o *WorkOptions) jetstream.StreamConfig {
	r := o.withDefaults()
	return jetstream.StreamConfig{
		Name:        ParkStream,
		Description: "mirrorworker jobs parked while their authority cannot take them",
		Subjects:    []string{ParkSubjectPrefix + ">"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		MaxMsgs:     -1,
		MaxBytes:    unlimited(r.ParkMaxBytes),
		MaxMsgSize:  MaxJobLen + 4096,
		Discard:     jetstream.DiscardNew,
		AllowDirect: true,
		Replicas:    r.Replicas,
	}
}

// PartitionsOf reads the partition count from MIRROR_WORK's configuration.
func PartitionsOf(cfg jetstream.StreamConfig) (int, error) {
	for _, s := range cfg.Sources {
		for _, t := range s.SubjectTransforms {
			if m := partitionRE.FindStringSubmatch(t.Destination); m != nil {
				return strconv.Atoi(m[1])
			}
		}
	}
	return 0, fmt.Errorf("stream %s has no partition transform", cfg.Name)
}

// CheckServer returns an error naming the server's version when it is older
// than MinServerVersion.
func CheckServer(nc *nats.Conn) error {
	v := nc.ConnectedServerVersion()
	if v == "" {
		return nil // not connected yet: the first request will fail clearly
	}
	if !versionAtLeast(v, MinServerVersion) {
		return fmt.Errorf("nats-server %s is too old: mirrorworker needs %s or newer (stream sources with subject transforms)", v, MinServerVersion)
	}
	return nil
}

func versionAtLeast(v, min string) bool {
	parse := func(s string) [3]int {
		var r [3]int
		s, _, _ = strings.Cut(strings.TrimPrefix(s, "v"), "-")
		for i, f := range strings.SplitN(s, ".", 3) {
			r[i], _ = strconv.Atoi(f)
		}
		return r
	}
	a, b := parse(v), parse(min)
	for i := range a {
		if a[i] != b[i] {
			return a[i] > b[i]
		}
	}
	return true
}

// EnsureWork creates MIRROR_WORK, MIRROR_PARKED and the two buckets when
// missing, and returns the partition count in force (an existing MIRROR_WORK
// keeps its own; asking for another is an error). A new MIRROR_WORK starts
// sourcing after what the single consumer of earlier versions had acked, so
// an upgrade neither loses nor redoes the backlog.
func EnsureWork(ctx context.Context, js jetstream.JetStream, o *WorkOptions) (int, error) {
	r := o.withDefaults()
	if r.Partitions > MaxPartitions {
		return 0, fmt.Errorf("partitions %d: at most %d", r.Partitions, MaxPartitions)
	}
	n := r.Partitions
	if s, err := js.Stream(ctx, WorkStream); err == nil {
		have, err := PartitionsOf(s.CachedInfo().Config)
		if err != nil {
			return 0, err
		}
		if o != nil && o.Partitions > 0 && o.Partitions != have {
			return 0, fmt.Errorf("stream %s has %d partitions; --partitions %d cannot change that (delete the stream when no job is in it to change it)", WorkStream, have, o.Partitions)
		}
		n = have
		if cfg := s.CachedInfo().Config; o != nil && o.Replicas > cfg.Replicas {
			cfg.Replicas = o.Replicas
			if _, err := js.UpdateStream(ctx, cfg); err != nil {
				return 0, fmt.Errorf("raise %s to %d replicas: %w", WorkStream, o.Replicas, err)
			}
		}
	} else if errors.Is(err, jetstream.ErrStreamNotFound) {
		var start uint64
		if c, err := js.Consumer(ctx, JobsStream, ConsumerName); err == nil {
			start = c.CachedInfo().AckFloor.Stream + 1
		}
		if _, err := js.CreateStream(ctx, WorkStreamConfig(&r, start)); err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return 0, fmt.Errorf("create stream %s: %w", WorkStream, err)
		}
	} else {
		return 0, fmt.Errorf("stream %s: %w", WorkStream, err)
	}
	// Replicas unset keeps what an existing stream has (a flagless start
	// must not shrink an R3 deployment), as EnsureStreams does.
	replicas := func(stream string) int {
		if o != nil && o.Replicas > 0 {
			return o.Replicas
		}
		if s, err := js.Stream(ctx, stream); err == nil {
			return s.CachedInfo().Config.Replicas
		}
		return 1
	}
	pc := ParkStreamConfig(&r)
	pc.Replicas = replicas(ParkStream)
	if _, err := js.CreateOrUpdateStream(ctx, pc); err != nil {
		return 0, fmt.Errorf("create or update stream %s: %w", ParkStream, err)
	}
	for _, kv := range []jetstream.KeyValueConfig{
		{Bucket: LeasesBucket, Description: "mirrorworker partition leases", History: 1, TTL: r.LeaseTTL, Storage: jetstream.FileStorage},
		{Bucket: PodsBucket, Description: "mirrorworker live pods and their status", History: 1, TTL: r.LeaseTTL, Storage: jetstream.FileStorage},
	} {
		kv.Replicas = replicas("KV_" + kv.Bucket)
		if _, err := js.CreateOrUpdateKeyValue(ctx, kv); err != nil {
			return 0, fmt.Errorf("create or update bucket %s: %w", kv.Bucket, err)
		}
	}
	return n, nil
}

// PartitionConsumerConfig returns the configuration of partition p's
// durable consumer on MIRROR_WORK (the single consumer's settings, narrowed
// to the partition).
func PartitionConsumerConfig(p int, o *ConsumerOptions) jetstream.ConsumerConfig {
	var r ConsumerOptions
	if o != nil {
		r = *o
	}
	r.Durable = PartitionConsumer(p)
	r.FilterSubjects = []string{PartitionFilter(p)}
	cfg := ConsumerConfig(&r)
	cfg.Description = fmt.Sprintf("mirrorworker jobs of partition %d", p)
	return cfg
}

// EnsurePartitionConsumer creates or updates partition p's consumer.
func EnsurePartitionConsumer(ctx context.Context, js jetstream.JetStream, p int, o *ConsumerOptions) (jetstream.Consumer, error) {
	cfg := PartitionConsumerConfig(p, o)
	c, err := js.CreateOrUpdateConsumer(ctx, WorkStream, cfg)
	if err != nil {
		return nil, fmt.Errorf("create or update consumer %s: %w", cfg.Durable, err)
	}
	return c, nil
}
