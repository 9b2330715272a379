# kconsume — see README.md. Every target runs from a fresh clone.
GO       ?= go
BIN      := bin/kconsume
FUZZTIME ?= 30s
PKGS     := ./...
KERNELS  ?= 5.10 6.1 6.12 newest newest-full

.PHONY: all build deps test faults lint bench fuzz generate generate-check vmlinux syscall-table vmtest clean

all: build

# bin/kconsume is static (no cgo: nothing in it needs C), so it runs in
# any VM image or initramfs without the host's libc, and maps 1.5 MiB less.
build:
	$(GO) build $(PKGS)
	CGO_ENABLED=0 $(GO) build -o $(BIN) ./cmd/kconsume

# The Debian packages the tests need (.ci/packages, the one list), those
# missing installed with apt-get; with all present this only asks dpkg.
deps:
	@.ci/deps

# KCONSUME_STRICT turns every "tool or privilege missing" skip into a failure.
# The privileged tests mount tracefs when it is missing (internal/testenv).
test: deps
	KCONSUME_STRICT=1 $(GO) test -race -count=1 $(PKGS)

# The fault suite (cmd/kconsume TestFaults) at length: FAULT_RUNS seeded
# runs, each a getpid workload of known count under a fault (relayd
# killed, stopped, cut mid-packet; a full tmpfs; record killed) at a random
# point; make test runs 3. FAULT_SEED=S FAULT_RUNS=1 repeats the run of
# seed S, as its subtest's name gives it.
FAULT_RUNS ?= 300
faults: deps
	KCONSUME_STRICT=1 KC_FAULT_RUNS=$(FAULT_RUNS) $(if $(FAULT_SEED),KC_FAULT_SEED=$(FAULT_SEED)) \
		$(GO) test -race -count=1 -timeout 6h -v -run '^TestFaults$$' ./cmd/kconsume

lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would change: $$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) tool staticcheck $(PKGS)

# Every benchmark against its baseline, in rounds (A/B/A/B), as one
# Markdown table printed and written to bench/results.md; see
# docs/performance.md. ROUNDS below 5 gives a quick look, not a result.
# The rows the host's kernel cannot run (kprobes, fentry, a preemptible
# kernel) run after the host's in one vmtest guest of BENCH_GUEST
# (BENCH_GUEST= skips them); BENCH_ONLY=host or guest runs only those,
# into bench/results-host.md or results-guest.md.
ROUNDS ?= 5
BENCH_GUEST ?= newest
BENCH_ONLY ?=
bench:
	$(GO) run ./bench -rounds $(ROUNDS) -guest '$(BENCH_GUEST)' -only '$(BENCH_ONLY)' -o bench/results$(if $(BENCH_ONLY),-$(BENCH_ONLY)).md

# Runs each fuzz target for FUZZTIME (the checked-in corpus runs in make test).
# Minimizing is capped at 100 runs per input: the golden trace seeds are tens
# of KiB, and the default 60 s per new input stalls the fuzzer at 0 execs/s.
FUZZ := $(GO) test -run '^$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 100x
fuzz:
	for f in FuzzStreamReader FuzzParseMetadata FuzzUnpacketizeMetadata FuzzRecover; do \
		$(FUZZ) -fuzz "^$$f\$$" ./relayfmt/ || exit 1; \
	done
	$(FUZZ) -fuzz '^FuzzParseFormat$$' ./consumer/tracefs/
	$(FUZZ) -fuzz '^FuzzTranscode$$' ./consumer/layout/
	$(FUZZ) -fuzz '^FuzzSymbolFiles$$' ./consumer/
	$(FUZZ) -fuzz '^FuzzParse$$' ./synth/
	$(FUZZ) -fuzz '^FuzzParse$$' ./filter/
	$(FUZZ) -fuzz '^FuzzMatch$$' ./filter/
	$(FUZZ) -fuzz '^FuzzIndexOf$$' ./relayd/
	$(FUZZ) -fuzz '^FuzzParseURL$$' ./relayd/
	$(FUZZ) -fuzz '^FuzzNotes$$' ./consumer/probe/

# bpf2go output (gen/); needs clang and llvm-strip. vmlinux.h is not rebuilt here: it comes from the running
# kernel's BTF (make vmlinux) and is committed.
generate:
	$(GO) generate $(PKGS)

# Fails when the committed generated code differs from a fresh generate.
generate-check: generate
	@test -z "$$(git status --porcelain -- gen consumer)" || { git status --short -- gen consumer; echo "generated code is stale or uncommitted: run make generate and commit"; exit 1; }

# The privileged suite inside QEMU guests, one per kernel of vmtest.toml
# (KERNELS picks some: make vmtest KERNELS=6.1). Tests are built on the
# host; kernels come from Debian's archive into ~/.cache/kconsume/vmtest.
vmtest:
	$(GO) run ./vmtest/cmd/vmtest test -kernels "$(KERNELS)" $(PKGS)

vmlinux:
	bpftool btf dump file /sys/kernel/btf/vmlinux format c > bpf/include/vmlinux.h

# consumer/recorder/sysnr_amd64.go, the x86_64 numbers of the syscall events, from the
# syscall table of a Debian linux-headers package of SYSNR_SUITE, fetched
# with apt-get through a private configuration (needs the archive; the
# newest kernels are in trixie-backports). Syscall numbers are ABI, so the
# newest table is right on older kernels too; syscalls newer than it keep
# their tracepoints.
SYSNR_PKG ?= linux-headers-7.3.4+deb13-amd64
SYSNR_SUITE ?= trixie-backports
syscall-table:
	set -e; d=$$(mktemp -d); trap 'rm -rf '$$d EXIT; \
	mkdir -p $$d/apt/lists/partial $$d/apt/cache/archives/partial $$d/apt/etc/sources.list.d \
		$$d/apt/etc/apt.conf.d $$d/apt/etc/preferences.d; touch $$d/apt/status; \
	echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $(SYSNR_SUITE) main" \
		> $$d/apt/etc/sources.list; \
	apt="apt-get -q -o Dir::Etc=$$d/apt/etc -o Dir::Etc::SourceList=$$d/apt/etc/sources.list \
		-o Dir::Etc::SourceParts=$$d/apt/etc/sources.list.d -o Dir::Etc::Parts=$$d/apt/etc/apt.conf.d \
		-o Dir::State=$$d/apt -o Dir::State::Lists=$$d/apt/lists -o Dir::State::status=$$d/apt/status \
		-o Dir::Cache=$$d/apt/cache -o APT::Architecture=amd64 -o APT::Architectures=amd64 \
		-o Debug::NoLocking=1 -o APT::Sandbox::User=root"; \
	$$apt update >/dev/null; \
	(cd $$d && $$apt download $(SYSNR_PKG) && dpkg-deb -x $(SYSNR_PKG)_*.deb x); \
	$(GO) run ./consumer/internal/mksysnr "$$(cd $$d && ls $(SYSNR_PKG)_*.deb)" \
		$$d/x/usr/src/$(SYSNR_PKG)/arch/x86/include/generated/asm/syscalls_64.h > consumer/recorder/sysnr_amd64.go.tmp; \
	mv consumer/recorder/sysnr_amd64.go.tmp consumer/recorder/sysnr_amd64.go

clean:
	rm -rf bin bench.out
