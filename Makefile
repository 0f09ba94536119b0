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

.PHONY: all venv build demo test bench lint format asan-test clean

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

bench: build
	$(VPY) benchmarks/bench_logging_overhead.py

# C built with -Werror into build/lint-lib (the in-place extension is left alone).
lint: venv
	FLASHINFER_EXTRA_CFLAGS="-Werror" $(VPY) setup.py -q build_ext --build-lib build/lint-lib --build-temp build/lint --force
	$(VENV)/bin/clang-format --dry-run -Werror $(C_SOURCES)
	$(VENV)/bin/ruff check flashinfer flashinfer_native tests benchmarks examples setup.py
	$(VENV)/bin/ruff format --check flashinfer flashinfer_native tests benchmarks examples setup.py

format: venv
	$(VENV)/bin/clang-format -i $(C_SOURCES)
	$(VENV)/bin/ruff format flashinfer flashinfer_native tests benchmarks examples setup.py

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
	rm -rf build $(VENV) flashinfer/_kernels*.so flashinfer_native/_C*.so *.egg-info
