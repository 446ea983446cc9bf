"""One command for the day a GPU is lent: exactness, the other modes, host synchronisations, timing, the estimator
and a short distributed-ready training run, written to one Markdown report and one JSON file.

On a CUDA machine it uses the shipped demo pair (`models/demo-en-de`) and its held-out rows, offline, in at most a
few minutes. Without CUDA it runs the same checks on CPU with tiny random models (under a minute), which is how the
test suite keeps this script from rotting.

    python benchmarks/gpu_check.py --output_dir outputs/gpu_check
    python benchmarks/gpu_check.py --device cpu          # the tiny CPU mode

Exactness on CUDA follows transformers' own rule: outputs may differ only where, at the first differing position,
the two runs' scores are allclose (cuBLAS picks kernels by shape, so a k-token verification and a 1-token step can
round differently at a near-tie). TF32 is switched off for the float32 checks.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, MarianConfig, MarianMTModel
from transformers.generation.streamers import BaseStreamer

from specdec_hf import SpecDrafterModel, speculative_generate
from specdec_hf.estimation import AcceptanceProfile, MeasurementSettings, estimate_shape
from specdec_hf.evaluation.host_syncs import HostSyncCounter
from specdec_hf.evaluation.interleaved import paired_speedups, spread, time_interleaved

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "models" / "demo-en-de"


@dataclass
class Context:
    """What every check shares: the device, the models and the sentences."""

    device: torch.device
    tiny: bool
    verifier: torch.nn.Module
    drafter: SpecDrafterModel
    assistant: torch.nn.Module
    tokenizer: object
    sentences: list[str]
    workdir: Path
    verifier_dir: Path
    results: dict = field(default_factory=dict)

    def inputs(self, rows: list[str]) -> dict[str, torch.Tensor]:
        return {
            key: value.to(self.device)
            for key, value in self.tokenizer(rows, return_tensors="pt", padding=True).items()
        }


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_context(device: torch.device, rows: int, workdir: Path) -> Context:
    """The shipped pair on CUDA; on CPU a tiny random Marian verifier and drafter with the shipped tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(DEMO / "verifier")
    lines = (DEMO / "heldout_test.jsonl").read_text(encoding="utf-8").splitlines()
    sentences = [json.loads(line)["translation"]["en"] for line in lines]
    if device.type == "cuda":
        verifier = AutoModelForSeq2SeqLM.from_pretrained(DEMO / "verifier", dtype=torch.float32)
        drafter = SpecDrafterModel.from_pretrained(DEMO / "drafter", dtype=torch.float32)
        assistant = AutoModelForSeq2SeqLM.from_pretrained(DEMO / "assistant", dtype=torch.float32)
        verifier_dir = DEMO / "verifier"
    else:
        torch.manual_seed(0)
        config = dict(
            vocab_size=len(tokenizer),
            d_model=32,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=128,
            init_std=0.2,  # no near-ties
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            decoder_start_token_id=tokenizer.pad_token_id,
            forced_eos_token_id=None,
        )
        verifier = MarianMTModel(MarianConfig(encoder_layers=2, decoder_layers=3, **config))
        assistant = MarianMTModel(MarianConfig(encoder_layers=1, decoder_layers=1, **config))
        drafter = SpecDrafterModel.from_verifier(
            verifier, max_draft_tokens=8, use_verifier_encoder=True, decoder_layers=1, prefix_attention="causal",
            verifier_state_layers=[1, 2, 3],
        )  # fmt: skip
        verifier_dir = workdir / "tiny_verifier"
        verifier.save_pretrained(verifier_dir)
        tokenizer.save_pretrained(verifier_dir)
    for model in (verifier, assistant):
        model.generation_config.max_length = None
    return Context(
        device=device,
        tiny=device.type != "cuda",
        verifier=verifier.to(device).eval(),
        drafter=drafter.to(device).eval(),
        assistant=assistant.to(device).eval(),
        tokenizer=tokenizer,
        sentences=sentences[:rows],
        workdir=workdir,
        verifier_dir=verifier_dir,
    )


GREEDY = dict(do_sample=False, num_beams=1, max_new_tokens=48)


def _same_or_tied(greedy, speculative, atol: float) -> tuple[int, int]:
    """(identical rows, rows that differ only after a position whose scores are allclose: transformers' rule)."""
    identical = tied = 0
    for row in range(greedy.sequences.shape[0]):
        a, b = greedy.sequences[row], speculative.sequences[row]
        width = min(a.shape[0], b.shape[0])
        differing = (a[:width] != b[:width]).nonzero()
        if len(differing) == 0 and a.shape[0] == b.shape[0]:
            identical += 1
            continue
        position = int(differing[0]) if len(differing) else width
        step = position - 1  # scores[i] is the distribution of the token at sequence position i + 1
        if 0 <= step < min(len(greedy.scores), len(speculative.scores)):
            if torch.allclose(
                greedy.scores[step][row].float(), speculative.scores[step][row].float(), atol=atol, rtol=0
            ):
                tied += 1
    return identical, tied


def check_exactness(ctx: Context) -> dict:
    """β=1 against greedy in float32 (TF32 off) and bfloat16, at batch 1 and 8."""
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    report = {}
    try:
        for dtype, atol in ((torch.float32, 1e-3), (torch.bfloat16, 5e-2)):
            verifier, drafter = ctx.verifier.to(dtype), ctx.drafter.to(dtype)
            for batch in (1, 8):
                identical = tied = total = 0
                for start in range(0, len(ctx.sentences), batch):
                    inputs = ctx.inputs(ctx.sentences[start : start + batch])
                    kwargs = dict(GREEDY, return_dict_in_generate=True, output_scores=True)
                    greedy = verifier.generate(**inputs, **kwargs)
                    speculative = verifier.generate(
                        **inputs, **kwargs, custom_generate=speculative_generate, drafter=drafter, num_draft_tokens=4
                    )
                    same, close = _same_or_tied(greedy, speculative, atol)
                    identical, tied, total = identical + same, tied + close, total + inputs["input_ids"].shape[0]
                key = f"{str(dtype).removeprefix('torch.')}_batch{batch}"
                report[key] = {"rows": total, "identical": identical, "differ_at_a_tie": tied}
                if identical + tied != total:
                    raise AssertionError(
                        f"{key}: {total - identical - tied} rows differ from greedy beyond a tie: {report}"
                    )
    finally:  # the checks after this one run as configured, whatever happened here
        ctx.verifier.float(), ctx.drafter.float()
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags
    return report


class _Collect(BaseStreamer):
    def __init__(self):
        self.tokens = []

    def put(self, value):
        self.tokens += value.flatten().tolist()

    def end(self):
        pass


def check_modes(ctx: Context) -> dict:
    """Sampling (reproducible), a confidence threshold and a logits processor (both = greedy), a streamer."""
    inputs = ctx.inputs(ctx.sentences[:4])
    spec = dict(custom_generate=speculative_generate, drafter=ctx.drafter, num_draft_tokens=4)
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        runs.append(ctx.verifier.generate(**inputs, do_sample=True, temperature=0.8, max_new_tokens=32, **spec))
    if not torch.equal(runs[0], runs[1]):
        raise AssertionError("speculative sampling is not reproducible under torch.manual_seed")
    greedy = ctx.verifier.generate(**inputs, **GREEDY)
    threshold = ctx.verifier.generate(**inputs, **GREEDY, **spec, draft_confidence_threshold=0.3)
    penalised = ctx.verifier.generate(**inputs, **GREEDY, repetition_penalty=1.3)
    penalised_spec = ctx.verifier.generate(**inputs, **GREEDY, repetition_penalty=1.3, **spec)
    one = ctx.inputs(ctx.sentences[:1])
    streamer = _Collect()
    streamed = ctx.verifier.generate(**one, **GREEDY, **spec, token_streamer=streamer)
    report = {
        "sampling_reproducible": True,
        "confidence_threshold_equals_greedy": bool(torch.equal(threshold, greedy)),
        "repetition_penalty_equals_greedy": bool(torch.equal(penalised_spec, penalised)),
        "streamer_received_every_token": streamer.tokens == streamed[0].tolist(),
    }
    failed = [name for name, passed in report.items() if not passed]
    if failed:
        raise AssertionError(f"modes that did not behave: {failed}")
    return report


GREEDY_SYNC_BUDGET = 2  # host synchronisations per iteration of the project's own code, greedy path


def _counted_per_iteration(ctx: Context, inputs: dict, kwargs: dict) -> tuple[list[int], dict]:
    """The project's host-synchronising calls after each verification but the last (the wrap-up)."""
    with HostSyncCounter(ctx.verifier) as counter:
        ctx.verifier.generate(**inputs, **kwargs)
    return counter.per_iteration()[:-1], dict(counter.counts)


def _cuda_syncs_per_iteration(ctx: Context, inputs: dict, kwargs: dict) -> list[int]:
    """torch's own count (`set_sync_debug_mode("warn")`: every synchronising CUDA call, the verifier's included)
    after each verification but the last."""
    marks = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        handle = ctx.verifier.register_forward_pre_hook(lambda module, args: marks.append(len(caught)))
        torch.cuda.set_sync_debug_mode("warn")
        try:
            ctx.verifier.generate(**inputs, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            handle.remove()
    return [after - before for before, after in pairwise(marks)]


def check_host_syncs(ctx: Context) -> dict:
    """Host synchronisations per iteration: at most two of the project's own on the greedy path at batch 1 and 4
    (off the CPU, whose greedy iterations settle on the host),
    the sampling path's count the same at k 4 and 8; on CUDA, also torch's sync debug mode per iteration."""
    report, failures = {}, []
    spec = dict(custom_generate=speculative_generate, drafter=ctx.drafter)
    for batch in (1, 4):
        inputs = ctx.inputs(ctx.sentences[:batch])
        kwargs = dict(GREEDY, **spec, num_draft_tokens=4)
        per_iteration, calls = _counted_per_iteration(ctx, inputs, kwargs)
        entry = {"project_max_per_iteration": max(per_iteration), "project_calls": calls}
        # on the CPU greedy iterations settle on the host (`host_outcome`), where a read waits for nothing: the
        # budget is an accelerator's
        if ctx.device.type != "cpu" and max(per_iteration) > GREEDY_SYNC_BUDGET:
            failures.append(f"greedy batch {batch}: {max(per_iteration)} > {GREEDY_SYNC_BUDGET} per iteration")
        if ctx.device.type == "cuda":
            cuda = _cuda_syncs_per_iteration(ctx, inputs, kwargs)
            entry["cuda_syncs_per_iteration_all_code"] = {"max": max(cuda), "mean": sum(cuda) / len(cuda)}
        report[f"greedy_batch{batch}"] = entry
    inputs = ctx.inputs(ctx.sentences[:4])
    sampling = {}
    for num_draft_tokens in (4, 8):  # 8: every mask slot of the shipped drafter (the test suite uses 10)
        torch.manual_seed(0)
        kwargs = dict(do_sample=True, temperature=0.8, max_new_tokens=32, **spec, num_draft_tokens=num_draft_tokens)
        per_iteration, _ = _counted_per_iteration(ctx, inputs, kwargs)
        sampling[num_draft_tokens] = max(per_iteration)
        report[f"sampling_k{num_draft_tokens}"] = {"project_max_per_iteration": max(per_iteration)}
    if len(set(sampling.values())) > 1:
        failures.append(f"sampling: the per-iteration count grows with k: {sampling}")
    if failures:
        raise AssertionError("; ".join(failures) + f": {report}")
    return report


def _timing_runners(ctx: Context, groups: list[dict], batch: int) -> dict[str, Callable[[int], object]]:
    runners: dict[str, Callable[[int], object]] = {
        "greedy": lambda g: ctx.verifier.generate(**groups[g], **GREEDY),
        "speculative": lambda g: ctx.verifier.generate(
            **groups[g], **GREEDY, custom_generate=speculative_generate, drafter=ctx.drafter, num_draft_tokens=4
        ),
    }
    if batch == 1:  # transformers' assisted generation refuses larger batches
        runners["assisted"] = lambda g: ctx.verifier.generate(**groups[g], **GREEDY, assistant_model=ctx.assistant)
    return runners


def check_timing(ctx: Context) -> dict:
    """Greedy, β=1 speculative and HF assisted generation, interleaved and synchronised, at batch 1, 4 and 16."""
    report = {}
    rows = ctx.sentences[: 4 if ctx.tiny else 64]  # tiny: the script must run, not measure
    for batch in (1, 4, 16):
        groups = [ctx.inputs(rows[start : start + batch]) for start in range(0, len(rows), batch)]
        runners = _timing_runners(ctx, groups, batch)
        for run in runners.values():
            run(0)  # warm-up
        times = time_interleaved(runners, len(groups), 3, ctx.device, desc=f"timing batch {batch}")
        report[f"batch{batch}"] = {
            name: {"time_s": spread(values)[0], "speedup": spread(paired_speedups(times["greedy"], values))}
            for name, values in times.items()
        }
    return report


def check_estimator(ctx: Context) -> dict:
    """The estimator on opus-mt-en-de's and bart-base's shapes (a tiny config in the CPU mode)."""
    if ctx.tiny:
        shapes = [str(ctx.verifier_dir)]
        settings = MeasurementSettings(sentences=1, max_new_tokens=8, rounds=1, calibration_rounds=1, device="cpu")
        num_draft_tokens_values = [2, 4]
    else:
        shapes = ["opus-mt-en-de", "bart-base"]
        settings = MeasurementSettings(device=str(ctx.device), prepack_linear=False)
        num_draft_tokens_values = [2, 4, 8]
    report = {}
    for shape in shapes:
        result = estimate_shape(
            shape, AcceptanceProfile.constant_for_tokens(2.5, 4), num_draft_tokens_values, [2.5, 3.0], settings
        )
        report[shape] = {
            "greedy_ms_per_token": result["greedy_ms_per_token"],
            "best_k": result["best_k"],
            "validation": result["validation"],
        }
    return report


def _run(command: list[str], env: dict) -> None:
    completed = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}")


def check_training(ctx: Context) -> dict:
    """Distil a few rows, `accelerate launch` 10 drafter steps with a checkpoint, resume to 20, decode exactly."""
    python = sys.executable
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    work = ctx.workdir / "training"
    launch_config = ROOT / "configs" / "accelerate" / ("cpu.yaml" if ctx.tiny else "single_gpu.yaml")
    data = DEMO / "heldout_test.jsonl"
    _run(
        [python, "-m", "specdec_hf.distillation", "--verifier", str(ctx.verifier_dir), "--data_files",
         f"train={data}", "--source_lang", "en", "--target_lang", "de", "--split", "train", "--max_samples",
         "32" if ctx.tiny else "128", "--max_new_tokens", "32", "--batch_size", "16", "--output_dir",
         str(work / "distilled")],
        env,
    )  # fmt: skip
    train = [
        python, "-m", "accelerate.commands.launch", "--config_file", str(launch_config), "train_drafter.py",
        "--verifier_name_or_path", str(ctx.verifier_dir), "--train_data", str(work / "distilled"),
        "--output_dir", str(work / "drafter"), "--max_draft_tokens", "4", "--drafter_config",
        '{"decoder_layers": 1, "prefix_attention": "causal"}', "--per_device_train_batch_size", "8",
        "--warmup_steps", "2", "--checkpointing_steps", "10", "--eval_steps", "1000", "--eval_samples", "8",
        "--eval_max_new_tokens", "16", "--logging_steps", "5",
    ]  # fmt: skip
    start = time.perf_counter()
    _run([*train, "--max_steps", "10"], env)
    _run([*train, "--max_steps", "20", "--resume_from_checkpoint", "latest"], env)
    seconds = time.perf_counter() - start
    drafter = SpecDrafterModel.from_pretrained(work / "drafter").to(ctx.device).eval()
    inputs = ctx.inputs(ctx.sentences[:4])
    greedy = ctx.verifier.generate(**inputs, **GREEDY)
    speculative = ctx.verifier.generate(**inputs, **GREEDY, custom_generate=speculative_generate, drafter=drafter)
    if not torch.equal(greedy, speculative):
        raise AssertionError("the trained drafter's β=1 output differs from greedy")
    state = json.loads((work / "drafter" / "eval_results.json").read_text())
    return {"train_and_resume_s": seconds, "final_step": state.get("step"), "decode_equals_greedy": True}


CHECKS: dict[str, Callable[[Context], dict]] = {
    "exactness": check_exactness,
    "modes": check_modes,
    "host_syncs": check_host_syncs,
    "timing": check_timing,
    "estimator": check_estimator,
    "training": check_training,
}


def write_reports(results: dict, output_dir: Path) -> None:
    """Write `gpu_check.json` and `gpu_check.md` with the checks run so far."""
    (output_dir / "gpu_check.json").write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")
    lines = [f"# GPU check on {results['cuda'] or 'CPU (tiny models)'} (torch {results['torch']})", ""]
    lines += ["| check | status | seconds | details |", "|---|---|---|---|"]
    for name, entry in results["checks"].items():
        details = {key: value for key, value in entry["details"].items() if key != "trace"}
        lines.append(
            f"| {name} | {entry['status']} | {entry['seconds']:.1f} | `{json.dumps(details, default=str)[:600]}` |"
        )
    (output_dir / "gpu_check.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def run_checks(device: torch.device, rows: int, output_dir: Path, only: list[str] | None = None) -> dict:
    """Runs the checks (all, or `only`), writes `gpu_check.md` and `gpu_check.json` after each (a run stopped by a
    time limit keeps what it measured); returns the JSON data."""
    output_dir.mkdir(parents=True, exist_ok=True)
    results = {"device": str(device), "cuda": torch.cuda.get_device_name(device) if device.type == "cuda" else None}
    results["torch"], results["checks"] = torch.__version__, {}
    with tempfile.TemporaryDirectory() as workdir, torch.inference_mode(False):
        ctx = build_context(device, rows, Path(workdir))
        for name, check in CHECKS.items():
            if only and name not in only:
                continue
            start = time.perf_counter()
            try:
                with torch.no_grad() if name != "training" else torch.enable_grad():
                    details, status = check(ctx), "passed"
            except Exception as error:  # one failing check must not hide the others' figures
                details, status = (
                    {"error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()},
                    "failed",
                )
            results["checks"][name] = {"status": status, "seconds": time.perf_counter() - start, "details": details}
            print(f"{name}: {status} ({time.perf_counter() - start:.1f} s)", flush=True)
            write_reports(results, output_dir)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rows", type=int, default=None, help="Held-out rows of the exactness check (64 on CUDA).")
    parser.add_argument("--output_dir", default="outputs/gpu_check")
    parser.add_argument("--only", nargs="*", choices=list(CHECKS), help="Run only these checks.")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    rows = args.rows or (64 if device.type == "cuda" else 8)
    results = run_checks(device, rows, Path(args.output_dir), args.only)
    return 0 if all(entry["status"] == "passed" for entry in results["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
