# Two commands for a fresh machine: `make demo` and `make test`. Both create .venv if missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# CI runs the reduced suite; `make test-all` runs every case, long ones included.
PYTEST_ARGS ?= -n 2 --dist loadfile

.PHONY: install chromium demo test test-all bench fuzz proto screenshot clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m progdesc demo --save-dir build/digits_model

# Debian's chromium for the browser tests (tests/browser.py skips them without it): installed
# when missing and root or passwordless sudo can run apt-get, quietly; never fails the target.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  command -v apt-get >/dev/null 2>&1 || exit 0; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif sudo -n true >/dev/null 2>&1; then SUDO="sudo -n"; else exit 0; fi; \
	  APT="$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get -qq"; \
	  $$APT install -y chromium >/dev/null 2>&1 || \
	  { $$APT update >/dev/null 2>&1 && $$APT install -y chromium >/dev/null 2>&1; } || \
	  echo "note: chromium could not be installed; the browser tests will be skipped"; }

test: $(STAMP) chromium
	$(PY) -m pytest $(PYTEST_ARGS) -m "not slow"

test-all: $(STAMP) chromium
	$(PY) -m pytest $(PYTEST_ARGS)

# The README's picture of the program viewer (needs the test extra's playwright and chromium).
screenshot: $(STAMP) chromium
	$(PY) docs/viewer_screenshot.py docs/viewer.png

bench: $(STAMP)
	$(PY) -m bench

# A soak of every loader with 100,000 mutated inputs (tests/fuzz_targets.py); prints a summary.
fuzz: $(STAMP)
	$(PY) -m bench.fuzz

# Regenerate lowering/progdesc_pb2.py from proto/progdesc.proto, and
# progdesc/paddle/framework_pb2.py from proto/paddle_framework.proto (tests fail when stale).
proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -Iproto --python_out=lowering proto/progdesc.proto
	$(PY) -m grpc_tools.protoc -Iproto --python_out=progdesc/paddle proto/paddle_framework.proto
	mv progdesc/paddle/paddle_framework_pb2.py progdesc/paddle/framework_pb2.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
