# flashinfer-c: every target makes its own virtualenv (.venv) with torch==2.13.0
# and the package installed editable, so a fresh machine needs nothing else.

PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
PIP := $(VPY) -m pip --disable-pip-version-check -q
DEPS := torch==2.13.0 click pytest safetensors numpy ruff clang-format
WARN := -Werror
ASAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1 -g
PYTEST_ARGS ?=
BUILD_FLAGS ?=
C_SOURCES := $(wildcard csrc/*/*.c csrc/*/*.h kernels/include/*.h kernels/cpu/*.c kernels/cpu/*.h \
	kernels/cuda/*.cu kernels/cuda/*.cuh)
PY_SOURCES := flashinfer flashinfer_native native/*.py tests benchmarks examples tools setup.py

# The real FlashInfer (flashinfer-python, ~2 GB with its dependencies) in a virtualenv of
# its own, kept between local runs (ignored by git); the core installed into it from
# native/ the way its users install it. torch goes in first and pinned, so that nothing
# pulls a CUDA torch.
FI_VENV ?= .venv-flashinfer
FI_PY := $(FI_VENV)/bin/python
FI_PIP := $(FI_PY) -m pip --disable-pip-version-check -q
FI_VERSION := 0.7.2.post1
NATIVE_SOURCES := $(wildcard flashinfer_native/*.py native/*.py native/*.toml native/*.pth \
	csrc/core/*.[ch] csrc/tensorfile/*.[ch] kernels/cpu/stats.c)

.PHONY: all venv build demo test test-flashinfer bench bench-flashinfer lint format asan-test clean

all: build

$(VENV)/.deps: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade "setuptools>=64" wheel
	$(PIP) install $(DEPS)
	$(PIP) install --no-build-isolation --no-deps -e .
	touch $@

venv: $(VENV)/.deps

# Rebuild the extension in place (fast; the editable install points here).
build: venv
	FLASHINFER_EXTRA_CFLAGS="$(WARN)" $(VPY) setup.py -q build_ext --inplace --build-temp build/release $(BUILD_FLAGS)

demo: build
	$(VPY) examples/demo.py

test: build
	$(VPY) -m pytest -q tests $(PYTEST_ARGS)

$(FI_VENV)/.deps:
	$(PYTHON) -m venv $(FI_VENV)
	$(FI_PIP) install --upgrade "setuptools>=64" wheel
	$(FI_PIP) install torch==2.13.0
	$(FI_PIP) install torch==2.13.0 flashinfer-python==$(FI_VERSION) pytest safetensors
	touch $@

$(FI_VENV)/.native: $(FI_VENV)/.deps $(NATIVE_SOURCES)
	FLASHINFER_NO_CUDA=1 $(FI_PIP) install --force-reinstall --no-deps ./native
	touch $@

# Tests of the core serving the real FlashInfer; the mirror's venv replays its dumps.
test-flashinfer: build $(FI_VENV)/.native
	cd tests/flashinfer_real && MIRROR_PYTHON=$(abspath $(VPY)) \
		$(abspath $(FI_VENV))/bin/pytest -q -p no:cacheprovider . $(PYTEST_ARGS)

bench: build
	$(VPY) benchmarks/bench_logging_overhead.py

bench-flashinfer: $(FI_VENV)/.native
	cd /tmp && $(abspath $(FI_PY)) $(abspath benchmarks/bench_native_vs_flashinfer.py)

# No dependency cycles between C files; C built with -Werror into build/lint-lib (the
# in-place extension is left alone); clang-format and ruff checks.
lint: venv
	$(VPY) tools/c_cycles.py csrc kernels
	FLASHINFER_EXTRA_CFLAGS="-Werror" $(VPY) setup.py -q build_ext --build-lib build/lint-lib --build-temp build/lint --force
	$(VENV)/bin/clang-format --dry-run -Werror $(C_SOURCES)
	$(VENV)/bin/ruff check $(PY_SOURCES)
	$(VENV)/bin/ruff format --check $(PY_SOURCES)

format: venv
	$(VENV)/bin/clang-format -i $(C_SOURCES)
	$(VENV)/bin/ruff format $(PY_SOURCES)

# The extension built with AddressSanitizer + UBSan and the whole suite run under it.
# Python itself is not instrumented, so the runtime is preloaded and leak checks are off.
asan-test: venv
	FLASHINFER_EXTRA_CFLAGS="$(ASAN_FLAGS)" FLASHINFER_EXTRA_LDFLAGS="-fsanitize=address,undefined" \
		FLASHINFER_NO_CUDA=1 $(VPY) setup.py -q build_ext --inplace --build-temp build/asan --force
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so):$$(gcc -print-file-name=libubsan.so)" \
		ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		$(VPY) -m pytest -q -p no:cacheprovider tests $(PYTEST_ARGS); \
		status=$$?; $(MAKE) --no-print-directory build BUILD_FLAGS=--force >/dev/null; exit $$status

clean:
	rm -rf build $(VENV) flashinfer/_kernels*.so flashinfer_native/_C*.so *.egg-info native/build
