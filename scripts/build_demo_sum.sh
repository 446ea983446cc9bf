#!/usr/bin/env bash
# The whole recipe of the offline summarization pair (models/demo-sum), from Debian packages to shipped weights.
# Each step resumes where it stopped; on a 2-core CPU, one thread each: the verifier about 3 hours, distillation
# 15 minutes, the drafter about an hour and its continuation another, the n-gram store seconds.
#   bash scripts/build_demo_sum.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export OMP_NUM_THREADS=1

# 1. corpus: a package's long description -> its one-line synopsis (apt-get download from Debian's archive)
[ -f data/debian_sum/train.jsonl ] ||
  $PY -m specdec_hf.data.debian_corpus --task summarization --output_dir data/debian_sum

# 2. the verifier: a BART trained from scratch; the shipped one stopped at step 3,292 (best/: the best validation
#    ROUGE-L of its evaluations, which run every 20 minutes of wall time: on another machine other steps are scored)
resume=""; [ -d runs/demo_sum_verifier/checkpoint-last ] && resume="--resume"
$PY scripts/train_demo_verifier.py --config configs/demo/verifier_sum.yaml --max_steps 3292 $resume
$PY scripts/export_demo_pair.py --task summarization --verifier runs/demo_sum_verifier/best \
  --verifier_config configs/demo/verifier_sum.yaml --output_dir models/demo-sum \
  --heldout data/debian_sum/test.jsonl --validation data/debian_sum/validation.jsonl

# 3. its greedy outputs on the training sources (sequence-level distillation; resumes from its shards)
$PY -m specdec_hf.distillation --config configs/data/debian_sum.yaml --verifier models/demo-sum/verifier \
  --split train --output_dir data/distilled/debian_sum/train --batch_size 64 --shard_size 2048 --device cpu

# 4. the drafter (configs/train/debian_sum.yaml: 2,000 steps), then its export beside the verifier, kept also in
#    runs/drafter_debian_sum_init for step 5 (a finished run is not resumed: that would evaluate and save it again)
# 5. continued (configs/train/debian_sum_continue.yaml: 3,000 steps more from that export), then exported over it
if [ ! -f runs/drafter_debian_sum_continue/model.safetensors ]; then
  if [ ! -d runs/drafter_debian_sum_init ]; then
    if [ ! -f runs/drafter_debian_sum/model.safetensors ]; then
      resume=""
      ls runs/drafter_debian_sum/checkpoint-*/training_state.json >/dev/null 2>&1 && resume="--resume_from_checkpoint latest"
      $PY train_drafter.py --config configs/train/debian_sum.yaml --num_threads 1 $resume
    fi
    $PY scripts/export_demo_pair.py --task summarization --drafter runs/drafter_debian_sum \
      --output_dir models/demo-sum --drafter_config configs/train/debian_sum.yaml --num_draft_tokens auto
    rm -rf runs/drafter_debian_sum_init.tmp
    cp -r models/demo-sum/drafter runs/drafter_debian_sum_init.tmp
    mv runs/drafter_debian_sum_init.tmp runs/drafter_debian_sum_init
  fi
  resume=""
  ls runs/drafter_debian_sum_continue/checkpoint-*/training_state.json >/dev/null 2>&1 && resume="--resume_from_checkpoint latest"
  $PY train_drafter.py --config configs/train/debian_sum_continue.yaml --num_threads 1 $resume
fi
$PY scripts/export_demo_pair.py --task summarization --drafter runs/drafter_debian_sum_continue \
  --output_dir models/demo-sum --drafter_config configs/train/debian_sum_continue.yaml --num_draft_tokens auto

# 6. the n-gram store of the verifier's outputs counted in step 3 (no training; a few seconds): what followed each
#    context of up to 2 tokens, and the source's preference (the drafter of the summarization pass's fastest rows)
$PY -m specdec_hf.drafters.build_ngram_store --verifier models/demo-sum/verifier \
  --distilled_data data/distilled/debian_sum/train --output_dir models/demo-sum/ngram_store
