# mirrorworker — see README.md. Needs only Go (the version in go.mod); Chromium
# (apt-get install -y chromium) is optional, for the load-test report's
# rendering tests, and `make test` says at the end when they were skipped.
GO        ?= go
DATA_DIR  ?= ./data
RUN_ARGS  ?=
# Packages with goroutines of their own run under the race detector in `make test`.
RACE_PKGS := ./clock/... ./cluster/... ./pacer/... ./worker/... ./fetch/... ./mirror/... ./stuborigin/... ./jobs/... ./replay/... ./admin/... ./strategy/...
PKGS      := ./...
# Tests skipped for a missing optional dependency append a line here
# (MW_SKIPPED_FILE); `make test` prints them as its closing lines.
SKIPPED   := $(CURDIR)/.test-skipped

.PHONY: all build run test test-race test-plain lint fmt-check vet bench clean

all: build

build:
	$(GO) build -ldflags "-X main.version=$$(git describe --always --dirty 2>/dev/null || echo dev)" -o bin/mirrorworker ./cmd/mirrorworker

## run: the worker on the embedded JetStream default (store and mirror under $(DATA_DIR)).
run: build
	./bin/mirrorworker run --data-dir $(DATA_DIR) --log-format console $(RUN_ARGS)

## test: vet, formatting, every test, and the race detector over the concurrent packages.
test: vet fmt-check test-plain test-race
	@if [ -s $(SKIPPED) ]; then \
		echo; echo "make test: PASSED, BUT SOME TESTS WERE SKIPPED (an optional dependency is missing):"; \
		sort -u $(SKIPPED) | sed 's/^/  SKIPPED /'; \
		echo "  (CI=true never skips them: .ci/run installs Chromium and fails without it.)"; \
	fi

test-plain:
	@rm -f $(SKIPPED)
	MW_SKIPPED_FILE=$(SKIPPED) $(GO) test -count=1 -timeout 15m $(PKGS)

test-race:
	$(GO) test -race -count=1 -timeout 15m $(RACE_PKGS)

vet:
	$(GO) vet $(PKGS)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

lint: vet fmt-check

## bench: benchmarks of every package (end-to-end jobs/s, pacer ns/op, stub origin req/s).
bench:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 2s $(PKGS)

clean:
	rm -rf bin
