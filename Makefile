SHELL := /bin/bash
GO ?= go
# Packages that start goroutines or share state run under the race detector.
RACE ?= -race
# Modules beside the root one, each with its own go.mod so that an application
# using one of them never downloads another's dependencies; go.work joins them
# for development, and make test, lint and bench run each.
MODULES = examples/worker idemgrpc idemconnect examples/frontdoors idemwatermill idemnats examples/orders
# deploy/deploytest checks what deploy/ ships (the image, the chart, the rules,
# the dashboard, the unit); it compiles Helm, the Kubernetes API and
# Prometheus, so make test runs it without the race detector.
DEPLOY_MODULES = deploy/deploytest
# Bench-only peers (internal/tools/fiberpeer: Fiber, for scripts/bench-http.sh)
# are modules of their own outside go.work, so that no module of idem's, nor
# the workspace, requires them; lint vets them alone.
BENCH_MODULES = internal/tools/fiberpeer

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: services
services: ## Start PostgreSQL, MariaDB, Redis (standalone + Cluster), RabbitMQ and NATS JetStream on loopback and print their URLs
	@scripts/services.sh

# PROGRESS reads go test -json: a line per package as it ends, failed tests'
# output in full, and every minute the packages still running.
PROGRESS = $(CURDIR)/.tmp/testprogress

.PHONY: test
test: lint ## Run every check and test CI runs (starts the services it needs; about 20 minutes on 2 cores)
	@scripts/tools.sh || echo "make: a tool did not install; its tests skip, or fail when CI=true" >&2
	@set -euo pipefail; mkdir -p .tmp; timeout 900 scripts/services.sh >.tmp/services.env || \
	echo "make: a service did not start; its tests skip, or fail when CI=true" >&2; \
	$(GO) build -o $(PROGRESS) ./internal/tools/testprogress; rm -f .tmp/tally; \
	. .tmp/services.env; \
	echo "test: module . (race detector on; a line per package as it ends)"; \
	$(GO) test $(RACE) -json -count=1 -timeout 20m ./... 2>&1 | $(PROGRESS) -tally .tmp/tally
	@set -euo pipefail; . .tmp/services.env; for m in $(MODULES); do \
		echo "test: module $$m"; (cd $$m && $(GO) test $(RACE) -json -count=1 -timeout 10m ./... 2>&1 | $(PROGRESS) -tally $(CURDIR)/.tmp/tally); \
	done
	@set -euo pipefail; for m in $(DEPLOY_MODULES); do \
		echo "test: module $$m (no race detector)"; (cd $$m && $(GO) test -json -count=1 -timeout 15m ./... 2>&1 | $(PROGRESS) -tally $(CURDIR)/.tmp/tally); \
	done
	@$(MAKE) --no-print-directory fuzz
	@$(PROGRESS) -total .tmp/tally

.PHONY: test-short
test-short: ## A first look: the root module's tests without the race detector or any server (those tests skip; a few minutes)
	@set -euo pipefail; mkdir -p .tmp; $(GO) build -o $(PROGRESS) ./internal/tools/testprogress; \
	env -u CI -u IDEM_TEST_POSTGRES_URL -u IDEM_TEST_MYSQL_DSN -u IDEM_TEST_REDIS_URL -u IDEM_TEST_REDIS_CLUSTER \
		-u IDEM_TEST_AMQP_URL -u IDEM_TEST_NATS_URL $(GO) test -short -json -count=1 ./... 2>&1 | $(PROGRESS)

.PHONY: bench
bench: ## Run the Go benchmarks (servers started as for make test)
	@set -euo pipefail; mkdir -p .tmp; timeout 900 scripts/services.sh >.tmp/services.env || \
	echo "make: a service did not start; its tests skip, or fail when CI=true" >&2; \
	. .tmp/services.env; \
	$(GO) test -run '^$$' -bench . -benchmem -count=1 ./...

.PHONY: chaos
chaos: ## Run the chaos tests of idem serve and of the broker consumers, 3 minutes of faults each (CHAOS_DURATION=10m for longer)
	@set -euo pipefail; mkdir -p .tmp; timeout 900 scripts/services.sh >.tmp/services.env || \
	echo "make: a service did not start; its tests skip, or fail when CI=true" >&2; \
	. .tmp/services.env; \
	IDEM_CHAOS=long $(GO) test $(RACE) -count=1 -timeout 2h -v -run '^TestChaos' ./internal/chaos $(if $(CHAOS_DURATION),-args -chaos.duration=$(CHAOS_DURATION))
	@set -euo pipefail; . .tmp/services.env; for m in idemwatermill idemnats; do \
		(cd $$m && IDEM_CHAOS=long $(if $(CHAOS_DURATION),IDEM_MSGCHAOS_DURATION=$(CHAOS_DURATION)) $(GO) test $(RACE) -count=1 -timeout 2h -v -run '^TestChaos' .); \
	done

# Fuzz targets, as package:function. make test runs each for FUZZTIME.
FUZZ_TARGETS = .:FuzzParseKeyHeader .:FuzzCanonicalJSON .:FuzzFingerprintMeaning \
	./idemstore:FuzzDecodeResponse ./idemstore:FuzzDecodeRequest \
	./idemproxy:FuzzParseConfig \
	./idemseal:FuzzOpen ./idemseal:FuzzSealRoundTrip \
	./internal/audit:FuzzScanYAML
FUZZTIME ?= 15s

.PHONY: fuzz
fuzz: ## Fuzz key parsing, JSON canonicalisation, record decoders, the config parser, sealed answers and the audit's YAML scan, FUZZTIME (15s) each
	@set -euo pipefail; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t#*:}; echo "fuzz: $$fn in $$pkg for $(FUZZTIME)"; \
		GO="$(GO)" scripts/fuzz.sh $$pkg $$fn $(FUZZTIME); \
	done

.PHONY: lint
lint: ## gofmt, go vet and staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt:"; echo "$$out"; exit 1; fi
	$(GO) vet ./... $(addprefix ./,$(addsuffix /...,$(MODULES) $(DEPLOY_MODULES)))
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./... $(addprefix ./,$(addsuffix /...,$(MODULES) $(DEPLOY_MODULES)))
	@set -e; for m in $(BENCH_MODULES); do (cd $$m && GOWORK=off $(GO) vet ./...); done

# VERSION is stamped into bin/idem (idem version, idem --version).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)

.PHONY: build
build: ## Build bin/idem (stamped with VERSION, git describe) and bin/idem-vet
	$(GO) build -ldflags "-X github.com/idem-dev/idem/internal/cli.version=$(VERSION)" -o bin/idem ./cmd/idem
	$(GO) build -o bin/idem-vet ./cmd/idem-vet

# IMAGE is the tag make image gives; CONTAINER_ENGINE builds it (podman, else docker).
IMAGE ?= idem:$(VERSION)
CONTAINER_ENGINE ?= $(shell command -v podman 2>/dev/null || command -v docker 2>/dev/null)

.PHONY: image
image: ## Build the container image IMAGE (idem:VERSION) from deploy/Containerfile, with podman or docker, from a static binary built here
	@if [ -z "$(CONTAINER_ENGINE)" ]; then echo "make image: neither podman nor docker is installed (scripts/tools.sh installs podman)" >&2; exit 1; fi
	CGO_ENABLED=0 GOOS=linux $(GO) build -trimpath -ldflags "-s -w -X github.com/idem-dev/idem/internal/cli.version=$(VERSION)" -o .tmp/image-bin/idem ./cmd/idem
	scripts/image-context.sh .tmp/image .tmp/image-bin/idem
	$(CONTAINER_ENGINE) build -f deploy/Containerfile -t $(IMAGE) \
		--build-arg VERSION=$(VERSION) --build-arg REVISION=$$(git rev-parse HEAD 2>/dev/null || echo unknown) \
		--build-arg CREATED=$$(date -u +%Y-%m-%dT%H:%M:%SZ) .tmp/image

.PHONY: tools
tools: ## Install the tools that check deploy/ (podman, buildah, promtool, systemd-analyze)
	scripts/tools.sh
