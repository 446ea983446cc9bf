# Set-up, main job, tests and style checks. `make demo` and `make test` each set up what they need.
PYTHON ?= python3
VENV ?= .venv
# The CPU wheel of torch (this pin finds it on disk on the project's machines); override for a GPU build, e.g.
# `make test TORCH_SPEC="torch>=2.4"`.
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE ?= 1

.PHONY: setup demo demo-check demo-full example test quality style benchmark

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev,peers]"
	touch $@

# the main job: the offline en->de pair shipped in models/demo-en-de on 100 of its held-out rows, greedy, beam-5 and
# speculative decoding timed interleaved over 3 repeats (outputs/demo_en_de/); HF assisted generation and
# CTranslate2 against greedy (outputs/demo_en_de_peers/); greedy and speculative decoding again with the verifier in
# bfloat16 (outputs/demo_en_de_bf16/); the summarization pair shipped in models/demo-sum on 100 of its held-out rows
# with its checkpoint's processors, greedy, its beam search, its trained drafter, the source-copy drafter, its n-gram
# store and prompt lookup
# (outputs/demo_sum/); then one table per task into docs/main_job.md and the README. It reads nothing but the
# working tree (no git history or tags, no network): `make demo-check` runs its checks alone.
DEMO_STARTED := $(shell date +%s)
DEMO_RUNS := --run float32=outputs/demo_en_de --run peers=outputs/demo_en_de_peers \
	--run bfloat16=outputs/demo_en_de_bf16 --run summarization=outputs/demo_sum
demo: setup
	$(PY) evaluate.py --config configs/eval/demo_en_de.yaml
	$(PY) evaluate.py --config configs/eval/demo_en_de_peers.yaml
	$(PY) evaluate.py --config configs/eval/demo_en_de_bf16.yaml
	$(PY) evaluate.py --config configs/eval/demo_sum.yaml
	$(PY) -m specdec_hf.evaluation.summary $(DEMO_RUNS) --output docs/main_job.md --readme README.md --started_at $(DEMO_STARTED)

# every check of the main job's commands (arguments, paths, data, models), without decoding: seconds
demo-check: setup
	$(MAKE) --no-print-directory -n demo | grep -E 'evaluate.py|specdec_hf.evaluation.summary' | \
		sed 's/$$/ --check_only/' | sh -e

# the float32 pass on all 200 held-out rows, 5 repeats, a wider batch-size sweep (about three times as long as that pass)
demo-full: setup
	$(PY) evaluate.py --config configs/eval/demo_en_de_full.yaml

# a tiny random verifier and a drafter trained for seconds: the API in a few lines
example: setup
	$(PY) examples/tiny_speculative_generation.py

test: setup
	$(PY) -m pytest -q

quality: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

style: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

benchmark: setup
	$(PY) benchmarks/bench_iteration_split.py --threads 2 --num_draft_tokens 2 --drafter_dtype float32 --repeats 5
