# smcr — make help lists the targets.
FUZZTIME  ?= 20s
BENCHTIME ?= 1s
VM_ITERS  ?= 2000
VM_ROUNDS ?= 3
PKGS      := ./...
# Go lives in /usr/local/go on these machines; a shell without a login profile,
# or sudo, may not have it on PATH. Recipes and the tests they run need it there.
# ($(shell) does not see an exported PATH in make 4.3, hence GO's full path.)
ifeq ($(shell command -v go),)
export PATH := $(PATH):/usr/local/go/bin
GO        ?= /usr/local/go/bin/go
endif
GO        ?= go
# The race pass leaves out what spawns binaries or boots the VM (their own
# timeouts do not stretch tenfold) and the benchmark driver.
RACE_PKGS  = $(shell $(GO) list ./... | grep -v -e /test/ -e /bench$$ -e /cmd/smcrbench$$)
# What smcrd -version and smcrctl version print: the release (VERSION) and the
# commit built, "-dirty" when the tree had changes.
VERSION   ?= $(shell cat VERSION)
COMMIT    ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null)$(shell git diff --quiet HEAD -- 2>/dev/null || echo -dirty)
LDFLAGS   := -X github.com/smcr-io/smcr/internal/version.Version=$(VERSION) -X github.com/smcr-io/smcr/internal/version.Commit=$(COMMIT)
PREFIX    ?= /usr/local
DESTDIR   ?=

# Serial even under -j (a MAKEFLAGS=-j in the environment): deps may install Go,
# which build needs, and nothing here gains from parallel recipes (go
# parallelises itself).
.NOTPARALLEL:

.PHONY: help deps build preload ldflags man install test test-unit test-race test-lockrank test-vm bench-vm bench-go lint fmt vet generate check-generate fuzz bench demo install clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

deps: ## install every system package, Go itself where missing, and the Go modules the project needs (Debian, as root)
	./scripts/deps.sh

build: preload ## build smcrd, smcrctl (static, no cgo), the tools and libsmcr-preload.so into bin/
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/ ./cmd/smcrd ./cmd/smcrbench ./cmd/verbsbench
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o bin/smcrctl ./cmd/smcrctl

preload: ## build libsmcr-preload.so, the direct mode's C library, into bin/ (needs gcc)
	$(MAKE) -C preload

man: ## regenerate the man pages in docs/man from smcrd's and smcrctl's own help
	mkdir -p docs/man
	$(GO) run ./cmd/smcrd -man smcrd > docs/man/smcrd.8
	$(GO) run ./cmd/smcrd -man smcrd.conf > docs/man/smcrd.conf.5
	$(GO) run ./cmd/smcrctl help --man > docs/man/smcrctl.8

ldflags: ## print the -ldflags that stamp the version and commit (for builds outside make)
	@echo '$(LDFLAGS)'

test: deps ## the whole suite: lint, generated-code freshness, unit + privileged + VM tests, race detector, short fuzzing; then each phase's time and the tests skipped, with why
	scripts/test.sh "$(MAKE)" $(if $(CI),10s,$(FUZZTIME))

test-unit: ## go test of every package (privileged and VM tests included; no race detector)
	scripts/gotest.sh $(GO) -count=1 -timeout 30m $(PKGS)

test-lockrank: ## the engine's tests with its mutexes checking the lock order (smcr/lockrank.go)
	scripts/gotest.sh $(GO) -tags lockrank -count=1 -timeout 20m ./smcr/

test-race: ## go test -race of every package but the end-to-end, VM and benchmark drivers, then the end-to-end suite against an smcrd built with -race (~5 min)
	scripts/gotest.sh $(GO) -race -count=1 -timeout 20m $(RACE_PKGS)
	@bin=$$(mktemp -d) && trap 'rm -rf "$$bin"' EXIT && \
	$(GO) build -race -o "$$bin/smcrd" ./cmd/smcrd && \
	CGO_ENABLED=0 $(GO) build -o "$$bin/testapp" ./test/e2e/testapp && \
	$(MAKE) -s -C preload BIN="$$bin" && \
	SMCR_E2E_BIN="$$bin" scripts/gotest.sh $(GO) -count=1 -timeout 20m ./test/e2e

lint: ## gofmt, go vet, staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) tool staticcheck $(PKGS)

generate: ## regenerate the bpf2go output (needs clang)
	$(GO) generate ./bpf/...

check-generate: ## fail if the committed generated code is stale
	./scripts/check-generate.sh

fuzz: ## run every fuzz target for FUZZTIME each
	./scripts/fuzz.sh $(FUZZTIME)

bench: ## every benchmark beside its baselines: report.md, report.json and plots in bench-out/ (QUICK=1: the 2-minute form)
	$(GO) run ./cmd/smcrbench -out bench-out $(if $(QUICK),-quick)

bench-go: ## the packages' go test -bench benchmarks (providers, codecs, e2e)
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) $(PKGS)

test-vm: ## only the VM tests on Debian 12's kernel: ibv provider + verbstest, engines, the transparent path and the direct mode on soft-RoCE, eBPF programs (~12 min)
	$(GO) test -count=1 -timeout 20m -v ./test/vm/...

bench-vm: ## ibv benchmarks beside perftest, and the engine beside TCP, in one VM boot (VM_ITERS, VM_ROUNDS)
	./test/vm/bench.sh $(VM_ITERS) $(VM_ROUNDS)

demo: deps build ## the main job: smcrd accelerating an unmodified program between two namespaces
	./scripts/demo.sh

install: build ## install smcrd, smcrctl, their man pages, the systemd unit and /etc/smcr/smcrd.conf (as root; PREFIX, DESTDIR)
	install -D -m 0755 bin/smcrd $(DESTDIR)$(PREFIX)/sbin/smcrd
	install -D -m 0755 bin/smcrctl $(DESTDIR)$(PREFIX)/bin/smcrctl
	install -D -m 0755 bin/libsmcr-preload.so $(DESTDIR)$(PREFIX)/lib/smcr/libsmcr-preload.so
	sed 's#/usr/local/#$(PREFIX)/#g' configs/smcrd.service > bin/smcrd.service
	install -D -m 0644 bin/smcrd.service $(DESTDIR)/etc/systemd/system/smcrd.service
	[ -e $(DESTDIR)/etc/smcr/smcrd.conf ] || install -D -m 0644 configs/smcrd.conf $(DESTDIR)/etc/smcr/smcrd.conf
	install -D -m 0644 configs/grafana-smcr.json $(DESTDIR)$(PREFIX)/share/smcr/grafana-smcr.json
	install -D -m 0644 docs/operations.md $(DESTDIR)$(PREFIX)/share/doc/smcr/operations.md
	install -D -m 0644 docs/man/smcrd.8 $(DESTDIR)$(PREFIX)/share/man/man8/smcrd.8
	install -D -m 0644 docs/man/smcrctl.8 $(DESTDIR)$(PREFIX)/share/man/man8/smcrctl.8
	install -D -m 0644 docs/man/smcrd.conf.5 $(DESTDIR)$(PREFIX)/share/man/man5/smcrd.conf.5
	if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi

clean: ## remove build output
	rm -rf bin
