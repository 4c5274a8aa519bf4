# toolhost: `make run` builds everything and runs the demo; `make test` runs every test.
# Both install what is missing first (scripts/setup.sh, and scripts/setup-browser.sh for
# the screenshots). Go's build cache keeps repeat runs fast.

GO           ?= go
BIN          ?= bin
PLUGINS      ?= bash editfile grepglob screenshot
VERSION      ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
TEST_TIMEOUT ?= 20m
TESTFLAGS    ?=
BENCH        ?= .
BENCH_PKGS   ?= ./...
BENCH_COUNT  ?= 1
BENCHFLAGS   ?=

WASM_ENV := GOOS=wasip1 GOARCH=wasm

SHELL       := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

.PHONY: all run test bench build binary plugins setup setup-test vet clean help

all: build

help:
	@echo "make run      install what is missing, build, run the demo (bin/toolhost demo)"
	@echo "make test     install what is missing, build, go vet, go test -race ./..."
	@echo "make bench    run the benchmarks (BENCH=regexp BENCH_PKGS=./host BENCH_COUNT=5)"
	@echo "make build    build bin/toolhost and the plugins into bin/plugins"
	@echo "make plugins  build only the plugins"
	@echo "make clean    remove bin/"

# The demo takes a screenshot, so it needs the browser as well.
setup:
	@scripts/setup.sh
	@scripts/setup-browser.sh

# Tests also need what core/screenshot drives: Chromium and the Playwright driver (its
# tests skip, saying so, without them).
setup-test:
	@scripts/setup.sh --test
	@scripts/setup-browser.sh

# The plugins are WASI reactors: one go build per plugin (c-shared takes one main package).
plugins:
	@mkdir -p $(BIN)/plugins
	@for p in $(PLUGINS); do \
		echo "$(WASM_ENV) $(GO) build -buildmode=c-shared -o $(BIN)/plugins/$$p.wasm ./plugins/$$p"; \
		$(WASM_ENV) $(GO) build -buildmode=c-shared -o $(BIN)/plugins/$$p.wasm ./plugins/$$p || exit 1; \
	done

binary:
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN)/toolhost ./cmd/toolhost

build: plugins binary

run: setup build
	$(BIN)/toolhost demo

# The wasip1-only files of pdk/ and plugins/ are compiled by `make plugins`; vetting them
# with GOOS=wasip1 would also vet their tests, which run natively.
vet:
	$(GO) vet ./...

test: setup-test build vet
	$(GO) test -race -timeout $(TEST_TIMEOUT) $(TESTFLAGS) ./...

bench: setup build
	@mkdir -p $(BIN)
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -count $(BENCH_COUNT) -timeout 60m $(BENCHFLAGS) $(BENCH_PKGS) | tee $(BIN)/bench.txt
	@echo "saved to $(BIN)/bench.txt"

clean:
	rm -rf $(BIN)
