# Two commands on a fresh machine: `make demo` (set-up + the Multi30k recipe end to end) and `make test`.
PYTHON ?= python3
VENV ?= .venv
# torch is installed first, pinned, so the package's `torch>=2.3` range never pulls a CUDA build.
# Override for another machine, e.g. `make TORCH_SPEC="torch==2.5.1" test`.
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
MTKIT := $(BIN)/mtkit

# Multi30k: the recipe reads the Hugging Face dataset; use the local copy when it is there.
MULTI30K ?= ../shared/data/multi30k
RECIPE ?= recipes/multi30k/transformer.yaml
# Each Multi30k recipe FILE.yaml trains into runs/multi30k_FILE (its `name`).
RUN ?= runs/multi30k_$(basename $(notdir $(RECIPE)))
ifneq ($(wildcard $(MULTI30K)/train.de.gz),)
LOCAL_DATA := --set 'data.train={src: $(MULTI30K)/train.de.gz, tgt: $(MULTI30K)/train.en.gz}' \
	--set 'data.valid={src: $(MULTI30K)/val.de.gz, tgt: $(MULTI30K)/val.en.gz}' \
	--set 'data.test={src: $(MULTI30K)/test_2016_flickr.de.gz, tgt: $(MULTI30K)/test_2016_flickr.en.gz}'
endif
# The demo recipe trains the same model for a fixed 15-minute budget: the whole job stays under 20 minutes.
DEMO_RECIPE ?= recipes/multi30k/demo.yaml

.PHONY: install browser demo test test-fast recipe student lint bench clean

# Set-up prints one line a step; pip's own output goes to $(INSTALL_LOG).
INSTALL_LOG ?= /tmp/mtkit-install.log
$(VENV)/.installed: pyproject.toml
	@echo "set-up: virtualenv $(VENV)"
	@$(PYTHON) -m venv $(VENV)
	@$(BIN)/pip install --quiet --upgrade pip >$(INSTALL_LOG) 2>&1 || { cat $(INSTALL_LOG); exit 1; }
	@echo "set-up: $(TORCH_SPEC)"
	@$(BIN)/pip install --quiet "$(TORCH_SPEC)" >>$(INSTALL_LOG) 2>&1 || { cat $(INSTALL_LOG); exit 1; }
	@echo "set-up: mtkit and its dependencies (log: $(INSTALL_LOG))"
	@$(BIN)/pip install --quiet -e ".[dev]" >>$(INSTALL_LOG) 2>&1 || { cat $(INSTALL_LOG); exit 1; }
	@touch $@

install: $(VENV)/.installed

demo: install
	@echo "== 1/4 tokenizer"
	$(MTKIT) tokenizer train $(DEMO_RECIPE) $(LOCAL_DATA)
	@echo "== 2/4 prepare"
	$(MTKIT) prepare $(DEMO_RECIPE) $(LOCAL_DATA)
	@echo "== 3/4 train (15 minutes)"
	$(MTKIT) train $(DEMO_RECIPE) $(LOCAL_DATA) --overwrite
	@echo "== 4/4 evaluate"
	$(MTKIT) evaluate -m runs/multi30k_demo --split test

# A full recipe (about 90 minutes on 2 CPU cores); scores are in recipes/multi30k/README.md.
# `make recipe` trains the Transformer; `make recipe RECIPE=recipes/multi30k/rnn.yaml` the RNN.
recipe: install
	$(MTKIT) tokenizer train $(RECIPE) $(LOCAL_DATA)
	$(MTKIT) prepare $(RECIPE) $(LOCAL_DATA)
	$(MTKIT) train $(RECIPE) $(LOCAL_DATA)
	$(MTKIT) evaluate -m $(RUN) --split test

# Distillation (docs/making-data.md): the teacher (transformer_30m.yaml, 30 minutes) unless its run is there, then
# the student of recipes/multi30k/student.yaml (the teacher translates the training sources once, in prepare) and
# the student's CTranslate2 int8 export in runs/multi30k_student_int8.
TEACHER_RUN := runs/multi30k_transformer_30m
student: install
	@test -f $(TEACHER_RUN)/best.pt || $(MAKE) recipe RECIPE=recipes/multi30k/transformer_30m.yaml
	$(MTKIT) tokenizer train recipes/multi30k/student.yaml
	$(MTKIT) prepare recipes/multi30k/student.yaml
	$(MTKIT) train recipes/multi30k/student.yaml
	$(MTKIT) evaluate -m runs/multi30k_student --split test
	$(MTKIT) export -m runs/multi30k_student --format ctranslate2 --quantization int8 -o runs/multi30k_student_int8 --force

# The browser test (tests/system/serving/test_page.py) drives Debian's headless chromium through chromedriver.
# As root with apt-get, install them when missing; a failed install never fails `make test`
# (the test then says what is missing).
BROWSER_LOG ?= /tmp/mtkit-browser-install.log
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u 2>/dev/null)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing chromium for the browser test (log: $(BROWSER_LOG))…"; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			chromium chromium-driver; } >$(BROWSER_LOG) 2>&1 \
			|| echo "could not install chromium (see $(BROWSER_LOG)); the browser test will say what is missing"; \
	fi

# The full suite, all three tiers (what CI runs), with the 15 slowest tests listed at the end. pytest-xdist runs one
# worker per core, each on a core of its own; a test file's tests, and every user of one trained session fixture,
# stay in one worker (tests/conftest.py). TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= auto
# Python keeps compiled modules in __pycache__/ (ignored by git) for the tests even where the environment sets
# PYTHONDONTWRITEBYTECODE: without them every worker and every process a test starts compiles mtkit and the test
# files again (make test-fast from a fresh clone: 34 s of pytest without, 28-30 s with).
test test-fast: export PYTHONDONTWRITEBYTECODE =
test: install browser
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=15

# The unit tier for the inner loop: tests/ without integration/ and system/ (no training beyond a few updates of
# a tiny model, no servers, browsers or subprocesses; tests/test_tiers.py keeps it so).
test-fast: install
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder tests --ignore=tests/integration --ignore=tests/system --durations=5

lint: install
	$(BIN)/ruff check mtkit tests benchmarks

# Issue 4's configuration: ~3,600 target tokens per update; decoding with each engine.
BENCH_ARGS ?= --set train.batch_tokens=4096 --set decode.max_len_a=0 --set decode.max_len_b=100 --engines pytorch,ctranslate2,ctranslate2-int8
bench: install
	$(BIN)/python -m benchmarks.speed $(RECIPE) $(LOCAL_DATA) $(BENCH_ARGS)

# Check a lent GPU in one call (benchmarks/gpu_check.py, docs/performance.md): training tokens/s and MFU lever by
# lever for d256, d512 and d1024 models, the profiler's split of a step, and BLEU parity with the plain fp32 step.
# SMOKE=1: every part in seconds on a tiny model (what `make test` runs, on the CPU).
GPU_CHECK_ARGS ?=
.PHONY: gpu-check
gpu-check: install
	$(BIN)/python -m benchmarks.gpu_check $(if $(SMOKE),--smoke) $(GPU_CHECK_ARGS)

# OpenNMT-py 3.5.1 beside mtkit (benchmarks/peers.py, in its own virtualenv under .peers/): the same
# pieces, model and update size (make bench's), measured mtkit, OpenNMT-py, mtkit; about 20 minutes.
# On a fresh clone it first runs `mtkit tokenizer train` and `mtkit prepare` for the recipe and, with no
# trained run in $(RUN) to decode with, trains the recipe for 5 minutes into $(RUN)_peers_5m (kept and
# reused by later calls). Add `--model RUN_DIR` to PEERS_ARGS to decode another run instead, or
# `--train-budget 10m` for a longer short run (`--train-budget 0`: train none, stop without a run).
# `make peers PEERS_ARGS="--budget 15m"` instead trains OpenNMT-py for 15 minutes with the recipe's
# own settings and scores it on the test split.
PEERS_ARGS ?= --set train.batch_tokens=4096
.PHONY: peers
peers: install
	$(BIN)/python -m benchmarks.peers $(RECIPE) $(LOCAL_DATA) $(PEERS_ARGS)

clean:
	rm -rf $(VENV) runs data/multi30k_* .pytest_cache
