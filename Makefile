# toolhost: `make run` builds the CLI and runs the demo; `make test` runs every test.
# Both install what is missing first (scripts/setup.sh, and scripts/setup-browser.sh for
# the screenshots; for the tests, scripts/setup-e2b-sdk.sh and scripts/setup-mcp-client.sh
# too). Go's build cache keeps repeat runs fast.
#
# The built-in plugins are committed in internal/builtins/wasm and embedded in the binary, so a build
# needs no plugin step; `make plugins` rebuilds them after a change to their sources (a
# test of package plugins fails until it is run), and the result is committed.

GO           ?= go
BIN          ?= bin
# A hang bound per test package, not a budget: the root package takes about 8 minutes
# under -race on a quiet 2-core machine and 20 at load 40 (a shared CI machine).
TEST_TIMEOUT ?= 30m
TESTFLAGS    ?=
BENCH        ?= .
BENCH_PKGS   ?= ./...
BENCH_COUNT  ?= 1
BENCHFLAGS   ?=
DUEL_ROUNDS  ?= 10
# The targets the CLI is checked for (make cross; make test runs it). The local sandbox
# provider is Linux's; elsewhere the CLI serves E2B sandboxes, snapshots, screenshots of
# E2B previews and MCP.
CROSS_TARGETS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64 windows/arm64

# The test-only S3 server, a module of its own (see internal/store/s3/s3test).
GATEWAY      := internal/store/s3/s3test/gateway

SHELL       := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

.PHONY: all run test test-fleet test-k8s bench bench-check duel build cross plugins examples setup setup-test lint vet clean help

all: build

help:
	@echo "make run      install what is missing, build, run the demo (bin/toolhost demo)"
	@echo "make test     install what is missing, make lint, make cross, go test -race -vet=all ./..."
	@echo "make lint     gofmt, staticcheck (and the S3 test gateway's vet)"
	@echo "make vet      make lint, then go vet ./..."
	@echo "make test-fleet  the fleet test: 3 replicas, HAProxy, 8 MCP agents, kills and a rolling restart"
	@echo "make test-k8s    the kubernetes provider on a real single-node cluster built here (root; docs/KUBERNETES.md)"
	@echo "make bench    run the benchmarks (BENCH=regexp BENCH_PKGS=./internal/host BENCH_COUNT=5)"
	@echo "make bench-check  each headline figure of docs/BENCHMARKS.md as a ratio, 3 repeats: min/median/max, load, date"
	@echo "make duel     the same work in toolhost and in Extism, side by side (DUEL_ROUNDS=10)"
	@echo "make build    build bin/toolhost (the built-in plugins are inside it)"
	@echo "make cross    type-check every package and its tests for each of CROSS_TARGETS"
	@echo "make plugins  rebuild the built-in plugins into internal/builtins/wasm (commit the result)"
	@echo "make examples build the C example plugin (examples/c-wordcount; make test builds and tests it)"
	@echo "make clean    remove bin/"

# The demo takes a screenshot, so it needs the browser as well.
setup:
	@scripts/setup.sh
	@scripts/setup-browser.sh

# Tests also need what internal/screenshot drives: Chromium and the Playwright driver (tests
# that need a missing one skip, saying so; with CI=true they fail); and E2B's official
# JavaScript SDK, which drives the fake E2B in a test (it needs Node.js >= 20: where the
# machine has no such Node, the script says so and, unless CI=true, the test skips); and
# the AssemblyScript compiler that builds the AssemblyScript plugin kit's example
# (pdk/assemblyscript, internal/kitconform), likewise. The Rust kit's toolchain is
# Debian's rustc and cargo, from scripts/setup.sh --test.
setup-test:
	@scripts/setup.sh --test
	@scripts/setup-browser.sh
	@scripts/setup-e2b-sdk.sh || [ "$${CI:-}" != true ]
	@scripts/setup-mcp-client.sh || [ "$${CI:-}" != true ]
	@scripts/setup-assemblyscript.sh || [ "$${CI:-}" != true ]

# The plugins are WASI reactors, built with -trimpath (no path of this machine in them)
# and recorded with the digest of their sources in internal/builtins/wasm/manifest.json.
plugins:
	$(GO) generate ./internal/builtins

# The C example plugin, with clang and wasi-libc (scripts/setup.sh --test installs them);
# cli's TestCExamplePlugin builds it the same way and runs it through the CLI.
examples: setup-test
	$(MAKE) -C examples/c-wordcount

# toolhost version reports the module version and VCS revision the build records.
# It then compiles the plugins into the data dir's compilation cache (once; later builds
# find them there), so that no first call runs a plugin interpreted.
# CGO_ENABLED=0: a static binary. Every sandbox starts this binary as its agent, and
# without the dynamic loader and cgo's start it costs about 10 ms less CPU each time
# (docs/BENCHMARKS.md, issue 18's create). Names resolve with Go's own resolver
# (/etc/hosts, then the DNS servers of /etc/resolv.conf), not through nsswitch modules.
# On Linux, the CLI and, beside it, the sandbox's agent alone
# (internal/sandbox/local/agentbin), whose SHA-256 is linked into the CLI: each local
# sandbox then runs that executable as its agent, which starts in half the CPU of the
# CLI's (docs/LOCAL.md, "The agent"). Elsewhere there is no local sandbox: the CLI alone.
build:
ifeq ($(shell uname -s),Linux)
	CGO_ENABLED=0 $(GO) build -buildvcs=auto -o $(BIN)/toolhost-sandbox-agent ./internal/sandbox/local/agentbin
	CGO_ENABLED=0 $(GO) build -buildvcs=auto -ldflags "-X github.com/toolhost/toolhost/internal/sandbox/local.agentDigest=$$(sha256sum $(BIN)/toolhost-sandbox-agent | cut -d' ' -f1)" -o $(BIN)/toolhost ./cmd/toolhost
else
	CGO_ENABLED=0 $(GO) build -buildvcs=auto -o $(BIN)/toolhost ./cmd/toolhost
endif
	@$(BIN)/toolhost tools --warm --format json >/dev/null || \
		echo "make build: compiling the plugins ahead failed (the first calls will be slower)" >&2

# What differs per platform, for every target (scripts/cross.sh): every package and its
# tests type-checked from source (internal/crosscheck), nothing compiled. A Linux-only
# call outside a _linux.go file or a //go:build linux file fails here, not on a user's Mac.
cross:
	@CROSS_TARGETS="$(CROSS_TARGETS)" GO="$(GO)" scripts/cross.sh

run: setup build
	$(BIN)/toolhost demo

# The wasip1-only files of pdk/ and plugins/ are compiled by `make plugins`; vetting them
# with GOOS=wasip1 would also vet their tests, which run natively. staticcheck runs through
# `go tool`, so its version is the one go.mod pins (honnef.co/go/tools; `go get -tool
# honnef.co/go/tools/cmd/staticcheck@vX` moves it).
#
# make lint: gofmt, the S3 gateway's vet (the tests build the gateway the same way, so its
# packages are compiled once) and staticcheck. staticcheck reads every package's export
# data from a -race build (GOFLAGS=-race for the checker, not for building the checker),
# the build `go test -race` makes anyway: the graph of ~1,250 packages is compiled once
# for both, where `go vet ./...` then `go test -race` compiled it twice.
# make vet: lint, then `go vet ./...`. make test runs lint and leaves the vet to go test:
# -vet=all runs every analyzer `go vet` runs, on every package and its tests, over the
# test build (a package that fails vet fails its tests).
lint:
	@out="$$(gofmt -l . | grep -v '/node_modules/' || true)"; \
	if [ -n "$$out" ]; then echo "gofmt: these files are not formatted (gofmt -w them):"; echo "$$out"; exit 1; fi
	cd $(GATEWAY) && $(GO) vet ./...
	@staticcheck="$$($(GO) tool -n staticcheck)"; \
	echo "GOFLAGS=-race staticcheck ./..."; \
	GOFLAGS="-race $${GOFLAGS:-}" "$$staticcheck" ./...

vet: lint
	$(GO) vet ./...

# With CI=true (.ci/run) a test that lacks bubblewrap, the browser or another capability
# of the machine fails instead of skipping.
test: setup-test lint cross
	$(GO) test -race -vet=all -timeout $(TEST_TIMEOUT) $(TESTFLAGS) ./...

# The fleet test (cli TestFleet, build tag fleet): three serve replicas behind
# HAProxy on the S3 test gateway and the E2B fake, eight agents of the official MCP
# TypeScript client for FLEET_TEST_SECONDS (120) while replicas are killed, stopped and
# rolled. Not in .ci/run yet: it still fails one run in two (docs/FLEET.md, "Status").
test-fleet: setup-test
	$(GO) test -tags fleet -count=1 -run '^TestFleet$$' -timeout $(TEST_TIMEOUT) -v ./cli

# The kubernetes provider against a real single-node cluster that scripts/k8s builds and
# brings up on this machine (root; a cold build takes minutes, Go's cache keeps later ones
# short), torn down after: docs/KUBERNETES.md. Not part of make test.
test-k8s: setup-test
	TEST_TIMEOUT=$(TEST_TIMEOUT) scripts/k8s/test.sh $(TESTFLAGS)

bench: setup
	@mkdir -p $(BIN)
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -count $(BENCH_COUNT) -timeout 60m $(BENCHFLAGS) $(BENCH_PKGS) | tee $(BIN)/bench.txt
	@echo "saved to $(BIN)/bench.txt"

# The headline figures of docs/BENCHMARKS.md as an outside run checks them: each a ratio
# of two things measured in one run (or a time), three repeats, the table printed with
# min/median/max, the load average before and after, the date and the commit, and saved
# to bin/bench-check.md (BENCH_CHECK_ONLY=regexp narrows it to some figures). It judges
# nothing: a slow machine fails no target.
BENCH_CHECK_REPEATS ?= 3
BENCH_CHECK_ONLY    ?=
bench-check: setup
	@mkdir -p $(BIN)
	$(GO) run ./bench/check -repeats $(BENCH_CHECK_REPEATS) -only '$(BENCH_CHECK_ONLY)' -out $(BIN)/bench-check.md

# The duel against Extism's Go SDK: a module of its own (bench/duel), so Extism never
# enters toolhost's go.mod. It prints its table; benchstat, when installed, compares the
# batches it saved.
duel:
	@mkdir -p $(BIN)
	cd bench/duel && $(GO) run . -rounds $(DUEL_ROUNDS) -out $(CURDIR)/$(BIN)/duel.txt
	@if command -v benchstat >/dev/null; then benchstat -col /rt $(BIN)/duel.txt; \
	else echo "(go install golang.org/x/perf/cmd/benchstat@latest to compare the batches in $(BIN)/duel.txt)"; fi

clean:
	rm -rf $(BIN)
