# mirrorworker — see README.md. Needs only Go (the version in go.mod); Chromium
# (apt-get install -y chromium) is optional, for the load-test report's
# rendering tests, and `make test` says at the end when they were skipped.
GO        ?= go
DATA_DIR  ?= ./data
RUN_ARGS  ?=
# Packages with goroutines of their own run under the race detector in `make test`. The
# longest first (worker 145 s, loadtest 59 s under the race detector): go test runs them in
# this order, two at a time, and a long one started last would end the run alone.
RACE_PKGS := ./worker/... ./loadtest/... ./replay/... ./pipeline/... ./mirror/... ./cluster/... ./facts/... ./clock/... ./credentials/... ./pacer/... ./fetch/... ./stuborigin/... ./jobs/... ./admin/... ./strategy/... ./broker/... ./faultproxy/... ./policy/... ./bandwidth/...
PKGS      := ./...
# test-plain runs the other packages: the race run already runs every test of RACE_PKGS.
# Their tests that shrink under the race detector (raceEnabled) run plain too, at full size,
# and so does fetch's allocation count, which skips under it.
PLAIN_PKGS = $(filter-out $(shell $(GO) list $(RACE_PKGS)),$(shell $(GO) list $(PKGS)))
FULL_SIZE  := ^(TestParkingIsolationAtScale|TestSimulatedClusterKeepsOnePace|TestSimulatedClusterLinkFaults|TestDoAllocatesLittleBeyondNetHTTP)$$
# The end-to-end tier: tests of worker/ that run thousands of jobs through
# real JetStream, wait on real cooldowns and redeliveries, judge gaps as the
# origin's kernel timed them, or need the server's ack wait are in files
# built with this tag, so that `go test ./worker/` stays fast (its behaviour
# tests run on clock.Fake; ADR 0024); the race run and the full-size run
# build them in.
E2E_TAGS  := e2e
# Tests that mostly wait (floors, cooldowns, leases, real processes) call t.Parallel;
# this many run at once (go test's default is GOMAXPROCS, 2 on a 2-core machine).
PARALLEL  ?= 8
# Extra flags for every go test of `make test`: TESTFLAGS=-json gives each test's time.
TESTFLAGS ?=
# Tests skipped for a missing optional dependency append a line here
# (MW_SKIPPED_FILE); `make test` prints them as its closing lines.
SKIPPED   := $(CURDIR)/.test-skipped

.PHONY: all build run test test-race test-plain test-waiting test-timed test-deploy lint fmt-check vet bench bench-throughput bench-memory bench-s3 bench-politeness soak clean image

all: build

build:
	$(GO) build -ldflags "-X main.version=$$(git describe --always --dirty 2>/dev/null || echo dev)" -o bin/mirrorworker ./cmd/mirrorworker

## install: mirrorworker on your PATH: go install, into $(go env GOBIN) or $(go env GOPATH)/bin.
.PHONY: install
install:
	$(GO) install -ldflags "-X main.version=$$(git describe --always --dirty 2>/dev/null || echo dev)" ./cmd/mirrorworker
	@echo "installed $$(d=$$($(GO) env GOBIN); [ -n "$$d" ] || d=$$($(GO) env GOPATH)/bin; echo $$d)/mirrorworker"

## run: the worker on the embedded JetStream default (store and mirror under $(DATA_DIR)).
run: build
	./bin/mirrorworker run --data-dir $(DATA_DIR) --log-format console $(RUN_ARGS)

## test: vet, formatting, every test, the race detector over the concurrent packages, and
## the deploy module (manifests, dashboard, alerts, image; a module of its own, see deploy/).
# The steps overlap: the waiting tests, the race run, the deploy module and vet run at once
# (most of the waiting tests wait; the machine idles under them), and the serial tests that
# judge timing at the origin run last, alone (ORIGIN_TIMED, WORKER_TIMED; ADR 0024). Each step's output is
# printed when it ends (-O).
test: fmt-check
	@rm -f $(SKIPPED)
	@$(MAKE) --no-print-directory -j4 -O vet test-waiting test-race test-deploy
	@$(MAKE) --no-print-directory test-timed
	@if [ -s $(SKIPPED) ]; then \
		echo; echo "make test: PASSED, BUT SOME TESTS WERE SKIPPED (an optional dependency is missing):"; \
		sort -u $(SKIPPED) | sed 's/^/  SKIPPED /'; \
		echo "  (CI=true never skips them: .ci/run installs Chromium and fails without it.)"; \
	fi
test-deploy:
	cd deploy && $(GO) vet ./... && $(GO) test $(TESTFLAGS) -count=1 -timeout 15m ./...

## image: the OCI image, built here with no Docker and no registry: a static binary appended
## as one layer onto an empty base (deploy/cmd/mkimage). Writes bin/image (OCI layout) and
## bin/mirrorworker-image.tar (docker load -i). IMAGE_ARCH picks the architecture.
IMAGE_ARCH ?= $(shell $(GO) env GOARCH)
IMAGE_TAG  ?= mirrorworker:$(shell git describe --always --dirty 2>/dev/null || echo dev)
image:
	CGO_ENABLED=0 GOOS=linux GOARCH=$(IMAGE_ARCH) $(GO) build -trimpath \
	  -ldflags "-s -w -X main.version=$$(git describe --always --dirty 2>/dev/null || echo dev)" \
	  -o bin/mirrorworker-linux-$(IMAGE_ARCH) ./cmd/mirrorworker
	cd deploy && $(GO) run ./cmd/mkimage --binary ../bin/mirrorworker-linux-$(IMAGE_ARCH) --arch $(IMAGE_ARCH) \
	  --version "$$(git describe --always --dirty 2>/dev/null || echo dev)" --tag $(IMAGE_TAG) \
	  --oci ../bin/image --tar ../bin/mirrorworker-image.tar

# cmd/mirrorworker's serial tests that wait on real processes and judge timing or speed as
# the origin sees it (ADR 0024: they stay serial). `make test` runs them after every other
# step, so that no race run or build shares the cores with them; a new serial process test
# belongs here. Its tests that call t.Parallel need no entry.
ORIGIN_TIMED := ^(TestProcessClusterKeepsOnePace|TestProcessFailingOriginIsBackedOff|TestProcessClusterNATSRestart|TestREADMECommands|TestProcessPolicyChangesReachEveryPod|TestProcessClusterRollingRestart|TestProcessClusterHandsRedirectsToTheCDNsPod|TestProcessBandwidthCap|TestLoadtestPods|TestProcessPauseResumeStatus|TestReplayObeysAPauseGivenDuringIt|TestRunInProcess|TestRunLogsDeparturesToTheGivenEnvironment|TestReplayCommand)$$
# The worker's tests that judge gaps as the origin's kernel timed them, through real sockets
# and a proxy in the test process (ADR 0024). Under the race detector beside the other
# packages, the proxy's own relay was late by more than their slack (a 150 ms floor seen as
# 142.7 ms, then 148.96 ms): so they run with the serial tests, plain.
WORKER_TIMED := ^(TestFloorHoldsAtTheOrigin|TestFloorHoldsAtTheOriginBehindASlowConnect|TestWorkerThroughProxy)$$

test-plain:
	@rm -f $(SKIPPED)
	@$(MAKE) --no-print-directory test-waiting test-timed

# test-waiting: every test of the other packages but ORIGIN_TIMED. cmd/mirrorworker's process
# tests wait on real floors, cooldowns and leases (about 12 minutes one after another, under 3
# with PARALLEL at once beside the race run): its binary gets room beyond that. The full-size
# tests run beside the other packages, each go test failing the target.
test-waiting:
	@MW_SKIPPED_FILE=$(SKIPPED) $(GO) test $(TESTFLAGS) -count=1 -timeout 25m -parallel $(PARALLEL) -skip '$(ORIGIN_TIMED)' $(PLAIN_PKGS) & plain=$$!; \
	$(GO) test $(TESTFLAGS) -count=1 -timeout 15m -tags $(E2E_TAGS) -run '$(FULL_SIZE)' ./worker/ ./cluster/ ./fetch/; full=$$?; \
	wait $$plain && [ $$full -eq 0 ]

test-timed:
	MW_SKIPPED_FILE=$(SKIPPED) $(GO) test $(TESTFLAGS) -count=1 -timeout 15m -run '$(ORIGIN_TIMED)' ./cmd/mirrorworker/
	MW_SKIPPED_FILE=$(SKIPPED) $(GO) test $(TESTFLAGS) -count=1 -timeout 15m -tags $(E2E_TAGS) -run '$(WORKER_TIMED)' ./worker/

test-race:
	MW_SKIPPED_FILE=$(SKIPPED) $(GO) test $(TESTFLAGS) -race -count=1 -timeout 15m -tags $(E2E_TAGS) -parallel $(PARALLEL) -skip '$(WORKER_TIMED)' $(RACE_PKGS)

vet:
	$(GO) vet $(PKGS)
	$(GO) vet -tags $(E2E_TAGS) ./worker/...
	cd deploy && $(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

lint: vet fmt-check

## bench: benchmarks of every package (end-to-end jobs/s, pacer ns/op, stub origin req/s).
bench:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 2s $(PKGS)

## bench-throughput: the worker end to end against a raw pipeline of no project code, side by
## side, at 10, 1,000 and 10,000 authorities and at one (README: Sizing; docs/adr/0014).
bench-throughput:
	$(GO) test -run '^$$' -bench Throughput -benchtime 1x -timeout 60m -v ./cmd/mirrorworker/

## bench-memory: RSS of the worker over backlogs of 10,000 to 1,000,000 jobs on 100,000
## authorities (~15 minutes).
bench-memory:
	MW_BENCH_BACKLOG=10000,100000,1000000 $(GO) test -run '^$$' -bench BacklogMemory -benchtime 1x -timeout 60m ./cmd/mirrorworker/

## bench-s3: the worker into a real S3 server (versitygw) against raw pipelines of no project
## code, side by side: 4 KiB objects at 1,000 authorities, and one large object with peak RSS
## (MW_BENCH_S3_LARGE=1GiB for the 1 GiB case; README: S3 targets).
bench-s3:
	$(GO) test -run '^$$' -bench 'S3Throughput|S3LargeObject' -benchtime 1x -timeout 60m -v ./cmd/mirrorworker/

## bench-politeness: issue 35's side-by-side run against the nginx-like stub origin (2 and
## 10 r/s, burst 5, 429 + Retry-After 2 s, 300 files): the worker (one pod) at --floor 0,
## 100ms and 1s and the curl --retry reference; a table of drain / bound, rejections,
## requests while told to wait, gaps below the floor, dead letters. Real time: at least
## 150 s a 2 r/s run, one after another (MW_BENCH_POLITENESS_PARALLEL=8: all at once, as
## long as the slowest); MW_BENCH_POLITENESS_CELLS picks runs, _FILES the files, _REPORT
## a directory for each rate's report.html.
bench-politeness:
	$(GO) test -run '^$$' -bench Politeness -benchtime 1x -timeout 150m ./cmd/mirrorworker/

## soak: the crash soak (issue 13, R1): SIGKILLs at random moments of a 10,000-job run of a
## real worker process, then 0 lost, 0 corrupt, no partial or temporary file. ~5 GB of disk.
soak:
	$(GO) test -tags soak -count=1 -run TestSoakCrash -v -timeout 60m ./cmd/mirrorworker/

clean:
	rm -rf bin
