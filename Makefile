# kconsume — see README.md. Every target runs from a fresh clone.
GO       ?= go
BIN      := bin/kconsume
FUZZTIME ?= 30s
PKGS     := ./...

.PHONY: all build test lint bench fuzz generate vmtest clean

all: build

build:
	$(GO) build $(PKGS)
	$(GO) build -o $(BIN) ./cmd/kconsume

# KCONSUME_STRICT turns every "tool or privilege missing" skip into a failure.
test:
	KCONSUME_STRICT=1 $(GO) test -race -count=1 $(PKGS)

lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would change: $$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) tool staticcheck $(PKGS)

# Benchmarks with their baselines in the same run; see README "Performance".
bench:
	$(GO) test -run '^$$' -bench 'Write|ReadMerge' -benchmem -count 5 ./relayfmt/ | tee bench.out
	$(GO) test -run '^$$' -bench 'VsBabeltrace2' -benchtime 7x ./relayfmt/ | tee -a bench.out

# Runs each fuzz target for FUZZTIME (the checked-in corpus runs in make test).
fuzz:
	for f in FuzzStreamReader FuzzParseMetadata FuzzRecover; do \
		$(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime $(FUZZTIME) ./relayfmt/ || exit 1; \
	done

generate:
	$(GO) generate $(PKGS)

clean:
	rm -rf bin bench.out
