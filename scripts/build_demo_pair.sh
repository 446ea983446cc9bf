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
[ -f runs/drafter_debian_en_de/model.safetensors ] || \
  $PY train_drafter.py --config configs/train/debian_en_de.yaml --verifier_name_or_path runs/demo_verifier/best \
  --num_threads 1 &
drafter_pid=$!
$PY scripts/train_demo_verifier.py --config configs/demo/assistant_en_de.yaml \
  --tokenizer_name_or_path runs/demo_verifier/best --num_threads 1 &
assistant_pid=$!
wait $drafter_pid; wait $assistant_pid  # each checked: a plain `wait` hides a failed job from `set -e`

# 5. the v1 pair (git tag demo-v1 shipped it in models/demo-en-de): half-precision safetensors, tokenizers, model
#    cards, the held-out slice and its licence notice, in runs/demo_pair_v1, which pair v2 grows from
v1=runs/demo_pair_v1
$PY scripts/export_demo_pair.py --verifier runs/demo_verifier/best --drafter runs/drafter_debian_en_de \
  --assistant runs/demo_assistant/checkpoint-last --output_dir $v1 \
  --verifier_config configs/demo/verifier_en_de.yaml --assistant_config configs/demo/assistant_en_de.yaml

# the last complete checkpoint's step of a drafter run (0 without one): a phase already reached is skipped, so that a
# rerun of this script neither repeats it nor overwrites the trained drafter's evaluation with an empty one
reached() { { ls "$1"/checkpoint-*/training_state.json 2>/dev/null || true; } | sed 's|.*/checkpoint-\([0-9]*\)/.*|\1|' | sort -n | tail -1; }
phase() {  # phase <run directory> <last step> <train_drafter.py arguments...>
  local run=$1 target=$2; shift 2
  local step; step=$(reached "$run"); step=${step:-0}
  if [ "$step" -ge "$target" ]; then return; fi
  if [ "$step" -gt 0 ]; then set -- "$@" --resume_from_checkpoint latest; fi
  $PY train_drafter.py "$@" --output_dir "$run" --max_steps "$target"
}

# 6. v1's shipped drafter (third design, trained from scratch): the shipped verifier's outputs on all training
#    sources, then every split point per step, the verifier's decoder states and a 4,096-token head
#    (configs/train/debian_en_de_eagle.yaml, resumable), in three phases: soft labels to step 1,800, none from there,
#    a linear schedule over steps 4,400-6,000 (restarting above the rate reached, decaying to 0); it replaced the
#    earlier drafters (its own directory: the one above holds the outputs of runs/demo_verifier/best in float32)
$PY -m specdec_hf.distillation --config configs/data/debian_en_de.yaml --verifier $v1/verifier \
  --split train --batch_size 64 --max_new_tokens 96 --output_dir data/distilled/debian_en_de_shipped/train
v1_drafter=(--config configs/train/debian_en_de_eagle.yaml --train_data data/distilled/debian_en_de_shipped/train \
  --verifier_name_or_path $v1/verifier)
phase runs/drafter_debian_en_de_eagle 1800 "${v1_drafter[@]}"
phase runs/drafter_debian_en_de_eagle 4400 "${v1_drafter[@]}" --soft_label_weight 0 --num_threads 2
phase runs/drafter_debian_en_de_eagle 6000 "${v1_drafter[@]}" --soft_label_weight 0 --lr_scheduler_type linear \
  --num_threads 2
# k=4 was the fastest on the validation split (docs/RESULTS.md, "How the settings were chosen")
$PY scripts/export_demo_pair.py --drafter runs/drafter_debian_en_de_eagle --output_dir $v1 --num_draft_tokens 4

# 7. pair v2, shaped like real checkpoints, shipped in models/demo-en-de: verifier v2 (6 decoder layers, <pad> last as
#    in Marian checkpoints) grown from v1's by stacking its layers (configs/demo/verifier_v2_en_de.yaml reads
#    runs/demo_pair_v1/verifier), stopped at its best validation checkpoint
resume=""; [ -d runs/demo_verifier_v2/checkpoint-last ] && resume="--resume"
$PY scripts/train_demo_verifier.py --config configs/demo/verifier_v2_en_de.yaml $resume
$PY -m specdec_hf.distillation --config configs/data/debian_en_de.yaml --verifier runs/demo_verifier_v2/best \
  --split train --batch_size 64 --max_new_tokens 96 --output_dir data/distilled/debian_en_de_v2/train
# its drafter continues v1's (re-laid, reading v2's decoder layers 2, 4 and 6; one decoder layer: a second one
# bought no acceptance, docs/RESULTS.md), in three phases: the config's inverse-sqrt schedule on one thread to step
# 1,400, then a linear schedule to step 3,200 on two, then another to step 8,000 (restarting at 3.0e-4, decaying to
# 0); its assistant continues v1's for v1's budget (one core, run beside phase 1)
[ -d runs/drafter_v2_init ] || $PY scripts/grow_demo_drafter.py --drafter $v1/drafter --old_verifier $v1/verifier \
  --verifier runs/demo_verifier_v2/best --verifier_state_layers 2,4,6 --output_dir runs/drafter_v2_init
resume=""; [ -d runs/demo_assistant_v2/checkpoint-last ] && resume="--resume"
$PY scripts/train_demo_verifier.py --config configs/demo/assistant_v2_en_de.yaml $resume &
assistant_pid=$!
phase runs/drafter_v2 1400 --config configs/train/debian_en_de_v2.yaml
wait $assistant_pid
phase runs/drafter_v2 3200 --config configs/train/debian_en_de_v2.yaml --lr_scheduler_type linear --num_threads 2
phase runs/drafter_v2 8000 --config configs/train/debian_en_de_v2.yaml --lr_scheduler_type linear --num_threads 2
$PY scripts/export_demo_pair.py --verifier runs/demo_verifier_v2/best --drafter runs/drafter_v2 \
  --assistant runs/demo_assistant_v2/checkpoint-last --output_dir models/demo-en-de --num_draft_tokens auto \
  --verifier_config configs/demo/verifier_v2_en_de.yaml --assistant_config configs/demo/assistant_v2_en_de.yaml \
  --drafter_config configs/train/debian_en_de_v2.yaml
