# Set-up, main job, tests and style checks. `make demo` and `make test` each set up what they need.
PYTHON ?= python3
VENV ?= .venv
# The CPU wheel of torch (this pin finds it on disk on the project's machines); override for a GPU build, e.g.
# `make test TORCH_SPEC="torch>=2.4"`.
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE ?= 1

.PHONY: setup demo demo-full example test quality style benchmark

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev,peers]"
	touch $@

# the main job: the offline en->de pair shipped in models/demo-en-de on 100 of its held-out rows, speculative
# decoding against greedy timed interleaved over 3 repeats (results in outputs/demo_en_de/); then beam search, HF
# assisted generation and CTranslate2 against greedy (outputs/demo_en_de_peers/); then greedy and speculative
# decoding again with the verifier in bfloat16 (outputs/demo_en_de_bf16/); then the pair against the previous one
# (git tag demo-v1) on the same rows, with CTranslate2 on the pair whose layout it converts, and their BLEU on the 100
# validation rows the settings are tuned on (outputs/demo_pairs/)
demo: setup
	$(PY) evaluate.py --config configs/eval/demo_en_de.yaml
	$(PY) evaluate.py --config configs/eval/demo_en_de_peers.yaml
	$(PY) evaluate.py --config configs/eval/demo_en_de_bf16.yaml
	$(PY) benchmarks/compare_demo_pairs.py --pair v1=git:demo-v1 --pair v2=models/demo-en-de --ct2 --ct2_threads 1 \
		--validation_files models/demo-en-de/heldout_validation.jsonl

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
	$(PY) benchmarks/bench_loop_overhead.py --threads 1
