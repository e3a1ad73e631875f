# Every target here is listed in docs/contributing/index.md (the README names make demo and make test).
SHELL := /bin/bash
KUBERAY_VERSION ?= v1.6.1
GO ?= go
NODE ?= standin

.PHONY: build image chart release test unit fuzz soak bench e2e dev-cluster dev-cluster-down demo demo-down clean docs docs-gen
FUZZTIME ?= 60s
FUZZ_PACKAGES := ./internal/kuberay ./internal/validate ./internal/podtemplate ./internal/projection ./internal/gateway ./cmd/syncer/app

build: ## build bin/syncer
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/syncer ./cmd/syncer

image: ## build raysync's image as the Dockerfile's final stage describes it (no Docker engine) and push it to the registry of make dev-cluster NODE=real
	$(GO) run ./e2e/cmd/devcluster image

chart: ## helm package deploy/helm/raysync and helm push it (OCI) to the registry of make dev-cluster NODE=real
	$(GO) run ./e2e/cmd/devcluster chart

release: ## VERSION=x.y.z REGISTRY=host[:port][/path] [DOCS_URL=https://...]: syncer for linux and darwin (amd64, arm64) with SBOMs and SHA256SUMS in dist/, the image (linux/amd64+arm64, no Docker engine) and the chart (OCI) pushed to REGISTRY (docs/contributing/releasing.md)
	$(GO) run ./tools/release -version "$(VERSION)" -registry "$(REGISTRY)" $(if $(SET_VERSION),-set-version) $(if $(CA_FILE),-ca-file "$(CA_FILE)") $(if $(PLAIN_HTTP),-plain-http) $(if $(DOCS_URL),-docs-url "$(DOCS_URL)")

test: ## everything: vet, the docs site, unit tests, each fuzz target for 3s, then e2e on a local control plane with KubeRay v1.5.1 and v1.6.1
	$(GO) run ./e2e/cmd/devcluster build -first  # what the e2e packages build on first use, before they start (docs/contributing/harness.md)
	nice -n 19 $(GO) run ./e2e/cmd/devcluster build & rest=$$!; \
	nice -n 19 $(MAKE) --no-print-directory fuzz FUZZTIME=3s & fuzz=$$!; trap 'kill $$rest $$fuzz 2>/dev/null' INT TERM; \
	$(GO) vet ./... && $(MAKE) --no-print-directory docs && \
	$(GO) test -count=1 -timeout 80m ./e2e/realnode/... ./e2e/... ./...; rc=$$?; \
	wait $$fuzz || rc=1; wait $$rest || rc=1; exit $$rc  # the two longest packages first, side by side; the fuzz targets and the tools later tests use beside them, on the core the tests leave

fuzz: ## run every fuzz target for FUZZTIME (default 60s) each
	@set -e; for pkg in $(FUZZ_PACKAGES); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "fuzz $$pkg $$f ($(FUZZTIME))"; \
	    $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg > /dev/null || { $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime 1x $$pkg; exit 1; }; \
	  done; \
	done

unit: ## unit tests only (seconds)
	$(GO) test -count=1 -short ./...

e2e: ## e2e tests only; E2E_KUBECONFIG=<path> runs them against an existing cluster instead
	$(if $(E2E_KUBECONFIG),,$(GO) run ./e2e/cmd/devcluster build)
	$(GO) test -count=1 -timeout 80m -v ./e2e/...

bench: ## new-cluster race (pods starting 0/100 ms/1 s after creation), rotation fan-out vs a minimal client, idle cost, memory, External Secrets Operator side by side, rotation with running clusters, a fleet rotation, the admission webhook, real Ray (~80 min on 2 cores; prints tables, writes bench/results/latest.json)
	$(GO) run ./bench

soak: ## long e2e variants (1,000 clusters created in a burst while rotating)
	RAYSYNC_SOAK=1 $(GO) test -count=1 -timeout 60m -v -run 'TestSoak' ./e2e/...

dev-cluster: ## start etcd + kube-apiserver + kube-controller-manager + the kubelet and Ray stand-in (NODE=real: a real node, see docs/contributing/real-node.md) + KubeRay; kubeconfig in .dev/kubeconfig
	$(GO) run ./e2e/cmd/devcluster up -kuberay $(KUBERAY_VERSION) -node $(NODE)

dev-cluster-down: ## stop the dev cluster
	$(GO) run ./e2e/cmd/devcluster down

demo: ## the main job, end to end, on a fresh local control plane
	$(GO) run ./e2e/cmd/demo

demo-down: ## stop everything the demo started
	$(GO) run ./e2e/cmd/demo -down

docs: ## build the docs site strictly into site/ (mkdocs + Material from the hash-pinned docs/requirements.txt, installed once into the cache)
	docs/_hooks/build.sh

docs-gen: ## regenerate the reference pages and the chart README from the code (a test fails when they drift)
	$(GO) run ./tools/docgen

clean: dev-cluster-down ## stop the dev cluster, remove bin/, .dev/ and site/ (keeps the .cache/ of built binaries)
	rm -rf bin .dev site
