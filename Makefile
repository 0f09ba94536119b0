# flashinfer-c: every target makes its own virtualenv (.venv) with torch==2.13.0
# and the two distributions installed editable (the core, flashinfer-native from native/,
# then the mirror, flashinfer-c from the root, which requires it), so a fresh machine
# needs nothing else.

PYTHON ?= python3
comma := ,
VENV ?= .venv
VPY := $(VENV)/bin/python
PIP := $(VPY) -m pip --disable-pip-version-check -q
DEPS := torch==2.13.0 click pytest safetensors numpy ruff clang-format
WARN := -Werror
ASAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1 -g
PYTEST_ARGS ?=
BUILD_FLAGS ?=
C_SOURCES := $(wildcard csrc/*/*.c csrc/*/*.h kernels/include/*.h kernels/cpu/*.c kernels/cpu/*.h \
	kernels/cuda/*.cu kernels/cuda/*.cuh tests/fuzz/*.c tests/fuzz/*.h)
PY_SOURCES := flashinfer flashinfer_native native/*.py tests benchmarks examples tools setup.py

# The real FlashInfer (flashinfer-python, ~2 GB with its dependencies) in a virtualenv of
# its own, kept between local runs (ignored by git); the core installed into it from
# native/ the way its users install it. torch goes in first and pinned, so that nothing
# pulls a CUDA torch.
FI_VENV ?= .venv-flashinfer
FI_PY := $(FI_VENV)/bin/python
FI_PIP := $(FI_PY) -m pip --disable-pip-version-check -q
FI_VERSION := 0.7.2.post1
# flashinfer-bench, whose loader reads what `dumps --export-bench` writes (docs/replay.md).
FI_BENCH_VERSION := 0.1.2
NATIVE_SOURCES := $(wildcard flashinfer_native/*.py native/*.py native/*.toml native/*.pth \
	csrc/core/*.[ch] csrc/tensorfile/*.[ch] kernels/cpu/stats.c kernels/cpu/chunk_hash.c kernels/cpu/cpu_isa.c)

.PHONY: all venv build demo test test-flashinfer bench bench-flashinfer lint format asan-test fuzz \
	fuzz-tools fuzz-run-python gpu-check clean

all: build

$(VENV)/.deps: pyproject.toml native/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade "setuptools>=77" wheel
	$(PIP) install $(DEPS)
	# the root first: upgrading a .venv made before the split, pip's uninstall of the old
	# flashinfer-c removes the flashinfer-native script it used to own, so the core's
	# install comes after it
	$(PIP) install --no-build-isolation --no-deps -e .
	$(PIP) install --no-build-isolation --no-deps -e ./native
	touch $@

venv: $(VENV)/.deps

# $(call build_ext,VARIABLES,ARGUMENTS): `setup.py build_ext ARGUMENTS` of both
# distributions under the environment VARIABLES: native/'s (flashinfer_native._C, run in
# native/, so ARGUMENTS' paths are absolute), then the root's (flashinfer._kernels).
build_ext = (cd native && $(1) $(abspath $(VPY)) setup.py -q build_ext $(2)) && \
	$(1) $(VPY) setup.py -q build_ext $(2)

# Rebuild the extensions in place (fast; the editable installs point here).
build: venv
	$(call build_ext,FLASHINFER_EXTRA_CFLAGS="$(WARN)",--inplace --build-temp $(abspath build/release) $(BUILD_FLAGS))

demo: build
	$(VPY) examples/demo.py

test: build
	$(VPY) -m pytest -q tests $(PYTEST_ARGS)

$(FI_VENV)/.deps:
	$(PYTHON) -m venv $(FI_VENV)
	$(FI_PIP) install --upgrade "setuptools>=77" wheel
	$(FI_PIP) install torch==2.13.0
	$(FI_PIP) install torch==2.13.0 flashinfer-python==$(FI_VERSION) pytest safetensors
	touch $@

# flashinfer-bench, pinned, beside the venv's torch (a stamp of its own, so that an
# existing .venv-flashinfer gets it without being made again).
$(FI_VENV)/.bench: $(FI_VENV)/.deps
	$(FI_PIP) install torch==2.13.0 flashinfer-bench==$(FI_BENCH_VERSION)
	touch $@

$(FI_VENV)/.native: $(FI_VENV)/.deps $(NATIVE_SOURCES)
	FLASHINFER_NO_CUDA=1 $(FI_PIP) install --force-reinstall --no-deps ./native
	touch $@

# Tests of the core serving the real FlashInfer; the mirror's venv replays its dumps.
test-flashinfer: build $(FI_VENV)/.native $(FI_VENV)/.bench
	cd tests/flashinfer_real && MIRROR_PYTHON=$(abspath $(VPY)) \
		$(abspath $(FI_VENV))/bin/pytest -q -p no:cacheprovider . $(PYTEST_ARGS)

# The prepared GPU check (tools/gpu_check.sh): on a CUDA machine every CUDA path and the
# GPU benchmarks; elsewhere the build and the steps that need no device. GPU_CHECK_OUT
# receives summary.json, junit.xml and gpu_check.log.
GPU_CHECK_OUT ?= gpu_check_out
gpu-check: venv
	PYTHON=$(abspath $(VPY)) tools/gpu_check.sh $(GPU_CHECK_OUT)

bench: build
	$(VPY) benchmarks/bench_logging_overhead.py

bench-flashinfer: $(FI_VENV)/.native
	cd /tmp && $(abspath $(FI_PY)) $(abspath benchmarks/bench_native_vs_flashinfer.py)

# No dependency cycles between C files; C built with -Werror into build/lint-lib (the
# in-place extension is left alone); clang-format and ruff checks.
lint: venv
	$(VPY) tools/c_cycles.py csrc kernels
	$(call build_ext,FLASHINFER_EXTRA_CFLAGS="-Werror",--build-lib $(abspath build/lint-lib) --build-temp $(abspath build/lint) --force)
	$(VENV)/bin/clang-format --dry-run -Werror $(C_SOURCES)
	$(VENV)/bin/ruff check $(PY_SOURCES)
	$(VENV)/bin/ruff format --check $(PY_SOURCES)

format: venv
	$(VENV)/bin/clang-format -i $(C_SOURCES)
	$(VENV)/bin/ruff format $(PY_SOURCES)

# The extension built with AddressSanitizer + UBSan and the whole suite run under it.
# Python itself is not instrumented, so the runtime is preloaded and leak checks are off.
asan-test: venv
	$(call build_ext,FLASHINFER_EXTRA_CFLAGS="$(ASAN_FLAGS)" \
		FLASHINFER_EXTRA_LDFLAGS="-fsanitize=address$(comma)undefined" FLASHINFER_NO_CUDA=1,\
		--inplace --build-temp $(abspath build/asan) --force)
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so):$$(gcc -print-file-name=libubsan.so)" \
		ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		$(VPY) -m pytest -q -p no:cacheprovider tests $(PYTEST_ARGS); \
		status=$$?; $(MAKE) --no-print-directory build BUILD_FLAGS=--force >/dev/null; exit $$status

# Coverage-guided fuzzing, FUZZ_S seconds per target (tests/fuzz/README.md). The C readers
# (json, pickle, pt, safetensors) are libFuzzer targets built with clang and
# -fsanitize=fuzzer,address,undefined over an embedded interpreter (no torch); the
# dump-tree consumers and the repro exporter are atheris targets over the extension built
# with ASan/UBSan. Each target first replays its seed corpus and past crashes
# (tests/fuzz/{corpus,regressions}; the exporter starts from the dump-tree seeds).
FUZZ_S ?= 60
FUZZ_TARGETS := json pickle pt safetensors
FUZZ_PY_TARGETS := dumptree repro
FUZZ_SEEDS_repro := dumptree
FUZZ_DIR := build/fuzz
FUZZ_CFLAGS := -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined \
	-fno-sanitize-recover=undefined -Icsrc/tensorfile -Ikernels/include
FUZZ_OBJS := $(patsubst csrc/tensorfile/%.c,$(FUZZ_DIR)/obj/%.o,$(wildcard csrc/tensorfile/*.c))
FUZZ_DICT_json := tests/fuzz/json.dict
FUZZ_DICT_safetensors := tests/fuzz/json.dict
FUZZ_DICT_pickle := tests/fuzz/pickle.dict
FUZZ_DICT_pt := tests/fuzz/pt.dict
PY_INCLUDE = $(shell $(VPY) -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
PY_EMBED = $(shell $(VPY) -c 'import sysconfig as s; d, v = s.get_config_var("LIBDIR"), \
	s.get_config_var("LDVERSION"); print(f"-L{d} -Wl,-rpath,{d} -lpython{v} -ldl -lm")')
# $(call fuzz_run,NAME,COMMAND): fuzz target NAME for FUZZ_S seconds from its seed corpus
# and past crashes (read first, so a regression fails at once); prints the log's tail.
define fuzz_run
	$(2) -max_total_time=$(FUZZ_S) -print_final_stats=1 -timeout=30 -rss_limit_mb=4096 \
		-artifact_prefix=$(FUZZ_DIR)/crashes/$(1)- $(FUZZ_DIR)/corpus/$(1) \
		tests/fuzz/corpus/$(or $(FUZZ_SEEDS_$(1)),$(1)) \
		$(wildcard tests/fuzz/regressions/$(1)) > $(FUZZ_DIR)/$(1).log 2>&1; \
		status=$$?; grep -Ev '(NEW|REDUCE) +cov|Uses: ' $(FUZZ_DIR)/$(1).log | tail -n 25; (exit $$status)
endef

fuzz: fuzz-tools $(addprefix fuzz-run-,$(FUZZ_TARGETS)) fuzz-run-python
	@echo "== fuzzing summary ($(FUZZ_S) s per target; logs in $(FUZZ_DIR)/*.log)"
	@for t in $(FUZZ_TARGETS) $(FUZZ_PY_TARGETS); do \
		printf '%-12s %s edges of %s, %s execs/s\n' "$$t" \
			"$$(grep -o 'cov: [0-9]*' $(FUZZ_DIR)/$$t.log | tail -1 | cut -d' ' -f2)" \
			"$$(grep -o '[0-9]* inline 8-bit counters' $(FUZZ_DIR)/$$t.log | tail -1 | cut -d' ' -f1)" \
			"$$(grep -o 'average_exec_per_sec: *[0-9]*' $(FUZZ_DIR)/$$t.log | tr -dc 0-9)"; \
	done

# clang with its libFuzzer runtime: installed from the system's packages when missing
# (Debian/Ubuntu: clang + libclang-rt-dev; as root, or through sudo).
fuzz-tools: venv
	@echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' \
		| clang -x c -fsanitize=fuzzer -o /dev/null - 2>/dev/null || { \
		sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$sudo apt-get update -q && $$sudo apt-get install -y -q --no-install-recommends clang libclang-rt-dev; }
	$(PIP) install atheris==3.0.0
	mkdir -p $(FUZZ_DIR)/obj $(FUZZ_DIR)/crashes \
		$(addprefix $(FUZZ_DIR)/corpus/,$(FUZZ_TARGETS) $(FUZZ_PY_TARGETS))

$(FUZZ_DIR)/obj/%.o: csrc/tensorfile/%.c csrc/tensorfile/*.h | fuzz-tools
	clang $(FUZZ_CFLAGS) -I$(PY_INCLUDE) -c $< -o $@

# the writers take level-5 statistics while they write (fi_out_write_dense), and the chunk
# store hashes chunks: the CPU kernels
FUZZ_OBJS += $(FUZZ_DIR)/obj/kernel_stats.o $(FUZZ_DIR)/obj/kernel_chunk_hash.o
$(FUZZ_DIR)/obj/kernel_%.o: kernels/cpu/%.c kernels/include/*.h | fuzz-tools
	clang $(FUZZ_CFLAGS) -c $< -o $@

$(FUZZ_DIR)/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_common.h $(FUZZ_OBJS)
	clang $(FUZZ_CFLAGS) -I$(PY_INCLUDE) $< $(FUZZ_OBJS) $(PY_EMBED) -o $@

.PRECIOUS: $(FUZZ_DIR)/obj/%.o $(FUZZ_DIR)/fuzz_%

fuzz-run-%: $(FUZZ_DIR)/fuzz_%
	$(call fuzz_run,$*,$(FUZZ_DIR)/fuzz_$* -dict=$(FUZZ_DICT_$*))

# The Python targets: the extension in place, built once by clang with ASan/UBSan and
# libFuzzer's coverage hooks, each target under atheris's ASan + libFuzzer runtime; the
# normal build is restored afterwards.
ATHERIS_RUN = LD_PRELOAD="$$($(VPY) -c 'import atheris; print(atheris.path())')/asan_with_fuzzer.so" \
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	$(VPY) tests/fuzz/fuzz_$(1).py
fuzz-run-python: fuzz-tools
	$(call build_ext,CC=clang LDSHARED="clang -shared" FLASHINFER_NO_CUDA=1 \
		FLASHINFER_EXTRA_CFLAGS="$(ASAN_FLAGS) -fsanitize=fuzzer-no-link -Wno-missing-field-initializers" \
		FLASHINFER_EXTRA_LDFLAGS="-fsanitize=address$(comma)undefined",\
		--inplace --build-temp $(abspath $(FUZZ_DIR)/ext) --force)
	failed=0; \
	$(call fuzz_run,dumptree,$(call ATHERIS_RUN,dumptree)) || failed=1; \
	$(call fuzz_run,repro,$(call ATHERIS_RUN,repro)) || failed=1; \
	$(MAKE) --no-print-directory build BUILD_FLAGS=--force >/dev/null; exit $$failed

fuzz-run-dumptree fuzz-run-repro: fuzz-run-python
	@:

clean:
	rm -rf build $(VENV) flashinfer/_kernels*.so flashinfer_native/_C*.so *.egg-info native/build \
		native/*.egg-info
