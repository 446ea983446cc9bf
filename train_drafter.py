"""Train a Spec-Drafter for a verifier by sequence-level distillation (Xia et al., 2023, arXiv 2203.16487, §3.1).

The training data is the verifier's own output on the training sources (`python -m specdec_hf.distillation`):
the drafter learns what the *verifier* will say. Each step trains label-smoothed cross-entropy on the k tokens after
a random split of every target (the paper), or after every split point in one pass (`--split_points all`), with
optional soft labels from the verifier (`--soft_label_weight`) and GLAT-style glancing (`--glancing_ratio`); the
step itself is `specdec_hf.training.loss.drafter_training_loss`, shared with the in-memory trainer.

    accelerate launch train_drafter.py --config configs/train/debian_en_de.yaml [--max_steps 2000 ...]
    accelerate launch --config_file configs/accelerate/multi_gpu.yaml train_drafter.py --config ...

Resume an interrupted run with `--resume_from_checkpoint latest` (same output_dir).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import asdict
from pathlib import Path

import datasets
import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.logging import get_logger
from accelerate.utils import ProjectConfiguration, set_seed
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import AutoModelForSeq2SeqLM, get_scheduler

from specdec_hf import SpecDrafterModel
from specdec_hf.config_parsing import parse_yaml_and_cli
from specdec_hf.distillation import load_distilled_dataset
from specdec_hf.model_files import load_pretrained
from specdec_hf.training import (
    DistilledBatchCollator,
    DrafterTrainingArguments,
    LengthGroupedSampler,
    check_data_order,
    drafter_training_loss,
    evaluate_drafter,
    find_latest_checkpoint,
    frequent_token_ids,
    is_checkpoint_writer,
    load_checkpoint,
    prepare_output_dir,
    save_checkpoint_atomically,
    token_counts,
    token_coverage,
    write_model_card,
)

logger = get_logger(__name__)


def get_dataloaders(
    args: DrafterTrainingArguments, pad_token_id: int, vocab_size: int
) -> tuple[DataLoader, list[dict], datasets.Dataset]:
    """The training DataLoader (shuffled with `args.seed`), the held-out examples of the periodic evaluation, and the
    training rows themselves (every id checked against the verifier's `vocab_size`)."""
    train = load_distilled_dataset(args.train_data, vocab_size).select_columns(["input_ids", "target_ids"])
    if args.eval_data:
        held_out = load_distilled_dataset(args.eval_data, vocab_size).select_columns(["input_ids", "target_ids"])
        held_out = held_out.select(range(min(args.eval_samples, len(held_out))))
    else:
        if len(train) <= args.eval_samples:
            raise ValueError(
                f"train_data has {len(train)} rows, too few to hold out `eval_samples={args.eval_samples}`: "
                "lower eval_samples or pass `eval_data`."
            )
        held_out = train.select(range(len(train) - args.eval_samples, len(train)))
        train = train.select(range(len(train) - args.eval_samples))
    order = {"shuffle": True, "generator": torch.Generator().manual_seed(args.seed)}
    if args.group_by_length:
        lengths = [len(row["input_ids"]) + len(row["target_ids"]) for row in _rows(train, ["input_ids", "target_ids"])]
        # the generator keeps DataLoader from drawing its worker seed from the global RNG (which drives dropout)
        # whenever an iterator starts, so that a resumed run's dropout masks are those of the uninterrupted run
        order = {
            "sampler": LengthGroupedSampler(lengths, args.per_device_train_batch_size, args.seed),
            "generator": torch.Generator().manual_seed(args.seed),
        }
    loader = DataLoader(
        train,
        batch_size=args.per_device_train_batch_size,
        collate_fn=DistilledBatchCollator(pad_token_id=pad_token_id),
        **order,
    )
    return loader, [dict(row) for row in held_out], train


def _rows(dataset: datasets.Dataset, columns: list[str]):
    """The rows of some columns, read batch by batch from the memory-mapped dataset (never the whole column)."""
    for batch in dataset.select_columns(columns).iter(batch_size=10_000):
        yield from ({name: batch[name][i] for name in columns} for i in range(len(batch[columns[0]])))


def build_drafter(args: DrafterTrainingArguments, verifier, train: datasets.Dataset) -> SpecDrafterModel:
    """Continue from `drafter_name_or_path`, or build one from the verifier (its embeddings and encoder copied;
    with `draft_vocab_size`, a head over the most frequent target tokens of `train`)."""
    if args.drafter_name_or_path:
        if args.draft_vocab_size is not None:
            raise ValueError(
                "`draft_vocab_size` chooses the head of a new drafter; a continued drafter keeps its own. Drop one of "
                "`draft_vocab_size` and `drafter_name_or_path`."
            )
        drafter = load_pretrained(
            SpecDrafterModel.from_pretrained, args.drafter_name_or_path, "drafter_name_or_path", dtype=torch.float32
        )
        if args.drafter_config or args.max_draft_tokens != drafter.config.max_draft_tokens:
            raise ValueError(
                f"drafter_name_or_path continues a drafter with max_draft_tokens {drafter.config.max_draft_tokens} and "
                "its own config: drop `drafter_config` and set `max_draft_tokens` to match (or drop "
                "drafter_name_or_path to build anew)."
            )
        if drafter.config.vocab_size != verifier.config.vocab_size:
            raise ValueError(
                f"drafter_name_or_path has vocabulary {drafter.config.vocab_size}, the verifier "
                f"{verifier.config.vocab_size}: "
                "continue from a drafter of this verifier, or drop drafter_name_or_path to build a new one."
            )
        # a drafter of another vocabulary layout (e.g. before re-laying <pad> last) would learn on shifted ids
        for name in ("pad_token_id", "eos_token_id"):
            ours, theirs = getattr(drafter.config, name), getattr(verifier.config, name)
            if ours != theirs:
                raise ValueError(
                    f"drafter_name_or_path has {name} {ours}, the verifier {theirs}: the two lay out the vocabulary "
                    "differently. Re-lay the drafter first (specdec_hf.data.vocabulary_layout.relayout_spec_drafter, "
                    "as scripts/grow_demo_drafter.py does) or drop drafter_name_or_path to build a new one."
                )
        return drafter
    draft_vocab_ids = None
    if args.draft_vocab_size is not None:
        vocab_size = verifier.config.vocab_size
        counts = token_counts((row["target_ids"] for row in _rows(train, ["target_ids"])), vocab_size)
        draft_vocab_ids = frequent_token_ids(counts, args.draft_vocab_size)
        coverage = token_coverage(counts, draft_vocab_ids)
        logger.info(f"draft vocabulary: {args.draft_vocab_size} of {vocab_size} ids cover {coverage:.2%} of targets")
    drafter = SpecDrafterModel.from_verifier(
        verifier, max_draft_tokens=args.max_draft_tokens, draft_vocab_ids=draft_vocab_ids, **args.drafter_config
    )
    drafter.config.verifier_name_or_path = args.verifier_name_or_path
    return drafter


def data_order_settings(args: DrafterTrainingArguments, num_processes: int) -> dict:
    """What fixes which examples the first N batches of an epoch hold (with the data itself): a resume skips N
    batches, so these must not change between a checkpoint and its resume."""
    return {
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "num_processes": num_processes,
        "seed": args.seed,
    }


def split_generator(seed: int, micro_step: int, process_index: int) -> torch.Generator:
    """Split points depend only on (seed, micro-step, process): a resumed run draws exactly what it would have."""
    return torch.Generator().manual_seed((seed * 1_000_003 + micro_step) * 1_009 + process_index)


def training_function(args: DrafterTrainingArguments) -> dict:
    """Train, evaluate, checkpoint and save the drafter. Returns the last evaluation."""
    accelerator = Accelerator(
        mixed_precision=args.mixed_precision,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        log_with=args.report_to,
        project_config=ProjectConfiguration(project_dir=args.output_dir, save_on_each_node=args.save_on_each_node),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s", level=logging.INFO)
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    set_seed(args.seed)
    output_dir = Path(args.output_dir)
    writer = is_checkpoint_writer(accelerator)
    prepare_output_dir(
        output_dir, args.verifier_name_or_path, args.resume_from_checkpoint, args.overwrite_output_dir, remove=writer
    )
    accelerator.wait_for_everyone()  # an earlier run is removed before any process looks for checkpoints
    if writer:
        output_dir.mkdir(parents=True, exist_ok=True)
    if args.report_to:
        accelerator.init_trackers("spec_drafter", config={k: str(v) for k, v in asdict(args).items()})

    # float32 master copy whatever the stored dtype (a shipped model may be half precision); autocast does the rest
    verifier = load_pretrained(
        AutoModelForSeq2SeqLM.from_pretrained, args.verifier_name_or_path, "verifier_name_or_path", dtype=torch.float32
    )
    verifier = verifier.eval().to(accelerator.device)
    verifier.requires_grad_(False)
    # the evaluation passes max_new_tokens; a checkpoint's max_length would only make generate() warn every call
    verifier.generation_config.max_length = None
    pad = verifier.config.pad_token_id
    with accelerator.main_process_first():
        train_loader, eval_examples, train_rows = get_dataloaders(
            args, pad, verifier.config.get_text_config(decoder=True).vocab_size
        )
    drafter = build_drafter(args, verifier, train_rows)
    loss_settings = args.loss_settings()
    if loss_settings.split_points == "all" and drafter.config.prefix_attention != "causal":
        raise ValueError(
            "`split_points: all` needs a drafter with `prefix_attention: causal` (one pass serves every split only "
            "when the prefix attends causally): set it in `drafter_config`, or use `split_points: random`."
        )
    if loss_settings.soft_label_weight > 0 and loss_settings.split_points == "all" and args.max_splits is None:
        logger.warning(
            "soft labels over every split point hold the verifier's distribution for each (split, slot) pair: "
            "set `max_splits` (and/or `draft_vocab_size`) if memory runs short"
        )

    optimizer = torch.optim.AdamW(
        drafter.parameters(),
        lr=args.learning_rate,
        betas=(args.adam_beta1, args.adam_beta2),
        weight_decay=args.weight_decay,
    )
    # stepped by hand once per optimizer step, so `warmup_steps`/`max_steps` mean optimizer steps on any world size
    scheduler = get_scheduler(
        args.lr_scheduler_type, optimizer, num_warmup_steps=args.warmup_steps, num_training_steps=args.max_steps
    )
    drafter, optimizer, train_loader = accelerator.prepare(drafter, optimizer, train_loader)
    accelerator.register_for_checkpointing(scheduler)

    data_order = data_order_settings(args, accelerator.num_processes)
    state = {"step": 0, "epoch": 0, "batches_in_epoch": 0, "micro_step": 0, "data_order": data_order}
    if args.resume_from_checkpoint:
        checkpoint = (
            find_latest_checkpoint(output_dir)
            if args.resume_from_checkpoint == "latest"
            else Path(args.resume_from_checkpoint)
        )
        if checkpoint is None:
            raise FileNotFoundError(f"--resume_from_checkpoint latest: no complete checkpoint in {output_dir}.")
        # one registered object (the scheduler), and where the run stopped in its data
        state = load_checkpoint(
            accelerator, checkpoint, custom_objects=1, state_keys=("step", "epoch", "batches_in_epoch", "micro_step")
        )
        check_data_order(state.get("data_order"), data_order)
        state["data_order"] = data_order
        logger.info(f"resumed from {checkpoint} at step {state['step']}", main_process_only=True)

    # redirected to a file, a bar would flood it: the periodic log lines report progress instead
    progress = tqdm(
        total=args.max_steps,
        initial=state["step"],
        disable=not accelerator.is_local_main_process or not sys.stderr.isatty(),
        desc="train",
    )
    metrics: dict = {}
    first_step = state["step"]
    window_loss, window_tokens, window_start = 0.0, 0, time.perf_counter()
    # from_verifier / from_pretrained return eval mode: dropout must be on from the first step (and after a resume)
    drafter.train()
    while state["step"] < args.max_steps:
        train_loader.set_epoch(state["epoch"])
        batches = (
            accelerator.skip_first_batches(train_loader, state["batches_in_epoch"])
            if state["batches_in_epoch"]
            else train_loader
        )
        for batch in batches:
            with accelerator.accumulate(drafter):
                generator = split_generator(args.seed, state["micro_step"], accelerator.process_index)
                loss, num_tokens = drafter_training_loss(
                    drafter,
                    verifier,
                    batch,
                    loss_settings,
                    generator,
                    drafter=accelerator.unwrap_model(drafter),
                    autocast=accelerator.autocast,
                )
                accelerator.backward(loss)
                if accelerator.sync_gradients and args.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(drafter.parameters(), args.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad()
            state["micro_step"] += 1
            state["batches_in_epoch"] += 1
            window_loss += loss.item() / args.gradient_accumulation_steps
            window_tokens += num_tokens
            if not accelerator.sync_gradients:
                continue
            scheduler.step()
            state["step"] += 1
            progress.update(1)
            step = state["step"]

            if step % args.logging_steps == 0:
                elapsed = time.perf_counter() - window_start
                logs = {
                    "loss": window_loss / args.logging_steps,
                    "lr": scheduler.get_last_lr()[0],
                    "target_tokens_per_s": window_tokens * accelerator.num_processes / elapsed,
                }
                logger.info(f"step {step} " + " ".join(f"{k} {v:.4g}" for k, v in logs.items()))
                accelerator.log(logs, step=step)
                window_loss, window_tokens, window_start = 0.0, 0, time.perf_counter()
            if step % args.eval_steps == 0 or step == args.max_steps:
                metrics = _evaluate(accelerator, verifier, drafter, eval_examples, args, step)
            if step % args.checkpointing_steps == 0:
                save_checkpoint_atomically(accelerator, output_dir, step, state, args.checkpoints_total_limit)
            if step >= args.max_steps:
                break
        else:
            state["epoch"] += 1
            state["batches_in_epoch"] = 0
    progress.close()
    if state["step"] == first_step:
        # resumed at or past max_steps: no step ran, so evaluate the weights about to be saved rather than write an
        # empty eval_results.json and model card over the finished run's
        metrics = _evaluate(accelerator, verifier, drafter, eval_examples, args, state["step"])

    _save_final(accelerator, drafter, args, state["step"], metrics)
    accelerator.end_training()
    return metrics


def _evaluate(accelerator, verifier, drafter, eval_examples, args, step) -> dict:
    """Tok. and per-position accuracy on the held-out examples (main process; the others wait)."""
    metrics = {}
    if accelerator.is_main_process:
        model = accelerator.unwrap_model(drafter)
        metrics = evaluate_drafter(
            verifier, model, eval_examples, args.eval_batch_size, args.eval_max_new_tokens, seed=args.seed
        )
        positions = " ".join(f"{a:.2f}" for a in metrics["accuracy_by_position"])
        logger.info(f"step {step} eval Tok. {metrics['tokens_per_iteration']:.3f} accuracy by position [{positions}]")
        accelerator.log({"eval_tokens_per_iteration": metrics["tokens_per_iteration"]}, step=step)
    accelerator.wait_for_everyone()
    return metrics


def _save_final(accelerator, drafter, args: DrafterTrainingArguments, steps: int, metrics: dict) -> None:
    """save_pretrained (safetensors) with a model card and the last evaluation; push to the Hub if asked."""
    accelerator.wait_for_everyone()
    if not accelerator.is_main_process:
        return
    model = accelerator.unwrap_model(drafter)
    model.save_pretrained(args.output_dir, safe_serialization=True)
    Path(args.output_dir, "eval_results.json").write_text(json.dumps({"step": steps, **metrics}, indent=2))
    write_model_card(
        args.output_dir,
        model,
        args.verifier_name_or_path,
        args.dataset_description,
        steps,
        metrics,
        objective=args.loss_settings().describe(model.config.max_draft_tokens),
        model_name=args.hub_model_id,
    )
    logger.info(f"saved the drafter to {args.output_dir}")
    if args.push_to_hub:
        from huggingface_hub import HfApi

        api = HfApi()  # the token comes from HF_TOKEN / the login cache, never from the config or the logs
        api.create_repo(args.hub_model_id, exist_ok=True)
        api.upload_folder(
            repo_id=args.hub_model_id,
            folder_path=args.output_dir,
            ignore_patterns=["checkpoint-*", "*.tmp", "logs/*"],
        )
        logger.info(f"pushed to https://huggingface.co/{args.hub_model_id}")


def main(argv: list[str] | None = None) -> dict:
    """Parse `--config file.yaml` plus overrides and train."""
    datasets.disable_progress_bars()
    (args,) = parse_yaml_and_cli([DrafterTrainingArguments], argv)
    return training_function(args)


if __name__ == "__main__":
    main()
