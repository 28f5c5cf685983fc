# agentbox's entry points. hack/test.sh (and so .ci/run) calls them.
# `make help` lists them; each target's `##` comment is its line there.

# staticcheck, pinned; run through the Go module proxy.
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: help check lint vulncheck test e2e setup build bench fuzz release
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z0-9-]+:.*## / {printf "  make %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

check: ## gofmt, go vet, staticcheck, the CRDs and the CLI, role and shim config references as generated, the docs' links, that the README links every page and troubleshooting.md every refusal, the layering through every import, no file over 500 lines (no root)
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './_output/*')); \
	  [ -z "$$unformatted" ] || { echo "gofmt needed: $$unformatted" >&2; exit 1; }
	go vet ./...
	go vet -tags e2e ./internal/e2e
	go run $(STATICCHECK) ./...
	go run $(STATICCHECK) -tags e2e ./internal/e2e
	hack/crds.sh --check
	go test -count=1 -run 'TestCLIReference|TestRoleReference|TestShimConfigReference|TestRepositoryLinks|TestReadmeLinksEveryPage|TestTroubleshootingCoversRefusals|TestHowToPagesNameNoTests|TestLayering|TestFileLength' ./internal/cli ./internal/kubeapi ./internal/config ./internal/doclinks ./internal/structure

lint: ## golangci-lint, pinned (.golangci.yml: errorlint, errcheck on shim/, the layering by depguard)
	hack/lint.sh

vulncheck: ## govulncheck, pinned, against a pinned vulnerability database (hack/vulncheck-accepted.txt)
	hack/vulncheck.sh

test: ## unit tests under the race detector (no root: the ones that need root skip)
	go test -race -count=1 ./...

fuzz: ## every fuzz target for a short fixed time (FUZZTIME, default 10s)
	hack/fuzz.sh

e2e: ## the end-to-end suite against a private containerd and cluster (root; make setup first)
	hack/e2e.sh

setup: ## toolchain, binaries and images, cached (root)
	hack/setup.sh

build: ## the shim and the agentbox CLI into _output/bin
	hack/build.sh

release: ## a release into _output/release (VERSION=X.Y.Z): tarball, SHA256SUMS, SBOM, installer image, one manifest (RELEASES.md)
	hack/release.sh $(VERSION)

bench: ## benchmarks against the stock gVisor shim and runc (root)
	hack/bench.sh
