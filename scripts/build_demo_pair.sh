#!/usr/bin/env bash
# The whole recipe of the offline demo pair (models/demo-en-de), from Debian packages to shipped weights.
# Each step resumes where it stopped; on a 2-core CPU the verifier takes hours, the rest about an hour.
#   bash scripts/build_demo_pair.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}

# 1. corpus (apt-get download from Debian's archive, ~1 minute)
[ -f data/debian_en_de/train.jsonl ] ||
  $PY -m specdec_hf.data.debian_corpus --task translation --output_dir data/debian_en_de

# 2. the verifier: a small Marian en->de model trained from scratch to max_steps (--resume continues)
resume=""; [ -d runs/demo_verifier/checkpoint-last ] && resume="--resume"
$PY scripts/train_demo_verifier.py --config configs/demo/verifier_en_de.yaml --num_threads 2 $resume

# 3. the verifier's own outputs on the first 30k training sources (the best validation checkpoint is shipped)
$PY -m specdec_hf.distillation --config configs/data/debian_en_de.yaml --verifier runs/demo_verifier/best \
  --split train --max_samples "${DISTIL_SAMPLES:-30000}" --batch_size 64 --max_new_tokens 96 \
  --output_dir data/distilled/debian_en_de/train

# 4. the Spec-Drafter and, as the peer baseline, a small autoregressive assistant (same budget, one core each)
$PY train_drafter.py --config configs/train/debian_en_de.yaml --verifier_name_or_path runs/demo_verifier/best \
  --num_threads 1 &
$PY scripts/train_demo_verifier.py --config configs/demo/assistant_en_de.yaml \
  --tokenizer_name_or_path runs/demo_verifier/best --num_threads 1 &
wait

# 5. ship: half-precision safetensors, tokenizers, model cards, the held-out slice and its licence notice
$PY scripts/export_demo_pair.py --verifier runs/demo_verifier/best --drafter runs/drafter_debian_en_de \
  --assistant runs/demo_assistant/checkpoint-last --output_dir models/demo-en-de \
  --verifier_config configs/demo/verifier_en_de.yaml --assistant_config configs/demo/assistant_en_de.yaml

# 6. the shipped drafter (third design, trained from scratch): the shipped verifier's outputs on all training
#    sources, then every split point per step, the verifier's decoder states and a 4,096-token head
#    (configs/train/debian_en_de_eagle.yaml, resumable), in three phases: soft labels to step 1,800, none from there,
#    a linear schedule over steps 4,400-6,000 (restarting above the rate reached, decaying to 0); shipped in place of
#    the earlier drafters (its own directory: the one above holds the outputs of runs/demo_verifier/best in float32)
$PY -m specdec_hf.distillation --config configs/data/debian_en_de.yaml --verifier models/demo-en-de/verifier \
  --split train --batch_size 64 --max_new_tokens 96 --output_dir data/distilled/debian_en_de_shipped/train
run=runs/drafter_debian_en_de_eagle
drafter=(train_drafter.py --config configs/train/debian_en_de_eagle.yaml --train_data data/distilled/debian_en_de_shipped/train)
# the last complete checkpoint's step (0 without one): a phase already reached is skipped, so that a rerun of this
# script neither repeats it nor overwrites the trained drafter's evaluation with an empty one
reached() { { ls "$run"/checkpoint-*/training_state.json 2>/dev/null || true; } | sed 's|.*/checkpoint-\([0-9]*\)/.*|\1|' | sort -n | tail -1; }
phase() {  # phase <last step> <arguments...>
  local target=$1; shift
  local step; step=$(reached); step=${step:-0}
  if [ "$step" -ge "$target" ]; then return; fi
  if [ "$step" -gt 0 ]; then set -- "$@" --resume_from_checkpoint latest; fi
  $PY "${drafter[@]}" --max_steps "$target" "$@"
}
phase 1800
phase 4400 --soft_label_weight 0 --num_threads 2
phase 6000 --soft_label_weight 0 --lr_scheduler_type linear --num_threads 2
# k=4 was the fastest on the validation split (docs/RESULTS.md, "How the settings were chosen"): generate()'s default k
$PY scripts/export_demo_pair.py --drafter runs/drafter_debian_en_de_eagle --output_dir models/demo-en-de \
  --num_draft_tokens 4
# the v1 pair as shipped (git tag demo-v1): what pair v2 grows from
mkdir -p runs/demo_pair_v1
cp -r models/demo-en-de/verifier models/demo-en-de/drafter models/demo-en-de/assistant runs/demo_pair_v1/

# 7. pair v2, shaped like real checkpoints: verifier v2 (6 decoder layers, <pad> last as in Marian checkpoints)
#    grown from v1 by stacking its layers (configs/demo/verifier_v2_en_de.yaml reads runs/demo_pair_v1/verifier)
resume=""; [ -d runs/demo_verifier_v2/checkpoint-last ] && resume="--resume"
$PY scripts/train_demo_verifier.py --config configs/demo/verifier_v2_en_de.yaml $resume
$PY -m specdec_hf.distillation --config configs/data/debian_en_de.yaml --verifier runs/demo_verifier_v2/best \
  --split train --batch_size 64 --max_new_tokens 96 --output_dir data/distilled/debian_en_de_v2/train
# its drafter continues v1's (re-laid, reading v2's layers 2, 4 and 6), its assistant continues v1's
$PY scripts/grow_demo_drafter.py --drafter runs/demo_pair_v1/drafter --old_verifier runs/demo_pair_v1/verifier \
  --verifier runs/demo_verifier_v2/best --verifier_state_layers 2,4,6 --output_dir runs/drafter_v2_init
$PY train_drafter.py --config configs/train/debian_en_de_v2.yaml &
$PY scripts/train_demo_verifier.py --config configs/demo/assistant_v2_en_de.yaml &
wait
$PY scripts/export_demo_pair.py --verifier runs/demo_verifier_v2/best --drafter runs/drafter_v2 \
  --assistant runs/demo_assistant_v2/checkpoint-last --output_dir models/demo-en-de --num_draft_tokens 4
