# agentbox's entry points. hack/test.sh (and so .ci/run) calls them.
#
#   make check   gofmt, go vet and staticcheck (no root)
#   make test    unit tests, under the race detector (no root: the ones
#                that need root skip)
#   make e2e     the end-to-end suite against a private containerd (root;
#                run make setup, or hack/setup.sh, first)
#   make setup   toolchain, binaries and images, cached (root)
#   make bench   benchmarks against the stock gVisor shim and runc (root)
#   make fuzz    every fuzz target for a short fixed time (FUZZTIME, 10s)

# staticcheck, pinned; run through the Go module proxy.
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: check test e2e setup build bench fuzz
check:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './_output/*')); \
	  [ -z "$$unformatted" ] || { echo "gofmt needed: $$unformatted" >&2; exit 1; }
	go vet ./...
	go vet -tags e2e ./internal/e2e
	go run $(STATICCHECK) ./...
	go run $(STATICCHECK) -tags e2e ./internal/e2e
	hack/crds.sh --check

test:
	go test -race -count=1 ./...

e2e:
	hack/e2e.sh

fuzz:
	hack/fuzz.sh

setup:
	hack/setup.sh

build:
	hack/build.sh

bench:
	hack/bench.sh
