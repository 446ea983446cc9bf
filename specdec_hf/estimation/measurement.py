"""Measuring one verifier shape on this machine: greedy, the cost of an iteration per k, and direct oracle runs.

Everything runs on random weights: a verifier built from a config, and a Spec-Drafter of the recommended design
built from it with `SpecDrafterModel.from_verifier`. The drafter's calls are real; its tokens come from
`ProfileOracleDrafter`, so the verifier accepts exactly what an acceptance profile says. EOS is switched off, so every
sentence generates the same number of tokens in greedy and speculative decoding, and their outputs are compared.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import AutoModelForSeq2SeqLM, PretrainedConfig, PreTrainedModel

from ..evaluation.interleaved import time_interleaved
from ..evaluation.timing import ModuleTimer, TimedDrafter, median, timed
from ..generation import speculative_generate
from ..linear_kernel_selection import KernelChoice, prepack_where_faster
from ..models import SpecDrafterModel
from ..models.verifier_conversion import decoder_hidden_state_count
from .oracle import ProfileOracleDrafter
from .profile import AcceptanceProfile

__all__ = [
    "IterationCost",
    "MeasurementSettings",
    "ShapeModels",
    "build_shape_models",
    "measure_greedy_reference",
    "measure_iteration_cost",
    "recommended_drafter",
    "time_direct_runs",
]

# the reduced LM head of the recommended design (the shipped demo drafter's)
RECOMMENDED_HEAD_SIZE = 4096


@dataclass(frozen=True)
class MeasurementSettings:
    """How a shape is measured: the inputs, the repeats and the machine settings."""

    sentences: int = 3
    source_length: int = 24
    max_new_tokens: int = 48
    rounds: int = 3
    calibration_rounds: int = 1
    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    prepack_linear: bool = True
    seed: int = 0
    drafter_overrides: dict | None = None


@dataclass
class ShapeModels:
    """The random-weight verifier and drafter of one shape, their inputs and the verifier's greedy outputs."""

    name: str
    verifier: PreTrainedModel
    drafter: SpecDrafterModel
    sources: list[dict[str, torch.Tensor]]
    references: list[torch.LongTensor] = field(default_factory=list)
    # with prepacking: the kernel chosen per linear layer signature of the verifier and of the drafter
    kernel_choices: dict[str, list[KernelChoice]] = field(default_factory=dict)

    @property
    def parameters(self) -> int:
        """The verifier's parameter count."""
        return sum(p.numel() for p in self.verifier.parameters())

    @property
    def new_tokens(self) -> int:
        """Tokens generated over all sentences (the same for every strategy: EOS is off)."""
        return sum(reference.shape[1] - 1 for reference in self.references)


@dataclass
class IterationCost:
    """
    What one speculative iteration costs at k drafts, and the fixed cost per sentence, in seconds.

    Args:
        num_draft_tokens (`int`): k.
        verify_s (`float`): One verifier forward over `[last token, d_1..d_k]` (LM head included).
        drafter_s (`float`): One drafter call (`propose`).
        loop_s (`float`): The rest of an iteration: the loop's own work (acceptance, bookkeeping, the oracle's
            token swap).
        fixed_s (`float`): Per sentence: the verifier's encoder, the drafter's `init_drafting_state` and
            `generate()`'s set-up and wrap-up.
        tokens_per_iteration (`float`): The Tok. the calibration runs reached.
    """

    num_draft_tokens: int
    verify_s: float
    drafter_s: float
    loop_s: float
    fixed_s: float
    tokens_per_iteration: float

    @property
    def iteration_s(self) -> float:
        """One iteration, all parts."""
        return self.verify_s + self.drafter_s + self.loop_s


def recommended_drafter(
    verifier: PreTrainedModel, max_draft_tokens: int, overrides: dict | None = None
) -> SpecDrafterModel:
    """
    The project's recommended Spec-Drafter design for `verifier`, untrained (the shipped demo drafter's design).

    One causal decoder layer at the verifier's width reading the verifier's encoder output (no encoder of its own),
    the verifier's decoder states of three layers (low, middle, top: EAGLE-3's fusion, Li et al. 2025) and a
    4,096-row reduced LM head.

    Args:
        verifier (`PreTrainedModel`): An encoder-decoder model of a family `from_verifier` supports.
        max_draft_tokens (`int`): The most drafts per call (learned mask queries).
        overrides (`dict`, *optional*): `SpecDrafterConfig` fields that replace the design's (another design);
            `draft_vocab_size` sets the reduced head's rows (0: the full vocabulary).

    Raises:
        ValueError: when `overrides["max_draft_tokens"]` is below `max_draft_tokens` (k beyond the drafter).
    """
    overrides = dict(overrides or {})
    slots = overrides.pop("max_draft_tokens", max_draft_tokens)
    if slots < max_draft_tokens:
        raise ValueError(
            f"k={max_draft_tokens} is beyond the drafter: its design drafts at most max_draft_tokens={slots} tokens "
            "per call; measure smaller k (--num_draft_tokens) or give the design more max_draft_tokens."
        )
    layers = decoder_hidden_state_count(verifier) - 1
    vocab_size = verifier.config.vocab_size
    head_size = overrides.pop("draft_vocab_size", RECOMMENDED_HEAD_SIZE)
    design = {
        "use_verifier_encoder": True,
        "decoder_layers": 1,
        "prefix_attention": "causal",
        "verifier_state_layers": sorted({max(1, round(layers / 3)), max(1, round(2 * layers / 3)), layers}),
        **overrides,
    }
    head = list(range(min(head_size, vocab_size))) if head_size else None
    return SpecDrafterModel.from_verifier(verifier, max_draft_tokens=slots, draft_vocab_ids=head, **design)


def build_shape_models(
    name: str, config: PretrainedConfig, settings: MeasurementSettings, max_draft_tokens: int
) -> ShapeModels:
    """
    A random-weight verifier of `config` (EOS off, greedy), its recommended drafter, and random source sentences.

    Args:
        name (`str`): The shape's name in reports.
        config (`PretrainedConfig`): From `load_verifier_config`.
        settings (`MeasurementSettings`): Inputs, device, dtype, prepacking, seed.
        max_draft_tokens (`int`): The largest k to be measured.
    """
    torch.manual_seed(settings.seed)
    device = torch.device(settings.device)
    verifier = AutoModelForSeq2SeqLM.from_config(config, dtype=settings.dtype).to(device).eval()
    generation = verifier.generation_config
    # every sentence runs to max_new_tokens in both decodings: nothing ends early by chance
    generation.eos_token_id = None
    generation.forced_eos_token_id = None
    generation.forced_bos_token_id = None
    for key, value in getattr(config, "generation_overrides", {}).items():
        setattr(generation, key, value)
    drafter = recommended_drafter(verifier, max_draft_tokens, settings.drafter_overrides)
    kernel_choices = {}
    if settings.prepack_linear and device.type == "cpu":
        kernel_choices = {"verifier": prepack_where_faster(verifier)}
        kernel_choices["drafter"] = prepack_where_faster(drafter, runs_after=verifier)
    generator = torch.Generator().manual_seed(settings.seed)
    low, high = 3, max(4, min(config.vocab_size, 32000) - 1)  # ordinary pieces, not special ids
    sources = []
    for _ in range(settings.sentences):
        input_ids = torch.randint(low, high, (1, settings.source_length), generator=generator).to(device)
        sources.append({"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)})
    return ShapeModels(name, verifier, drafter, sources, kernel_choices=kernel_choices)


def _greedy_kwargs(settings: MeasurementSettings) -> dict:
    return {"do_sample": False, "num_beams": 1, "max_new_tokens": settings.max_new_tokens}


@torch.no_grad()
def measure_greedy_reference(models: ShapeModels, settings: MeasurementSettings) -> None:
    """Greedy outputs of every sentence (the oracle's reference); also warms the kernels up."""
    models.references = [
        models.verifier.generate(**source, **_greedy_kwargs(settings)).cpu() for source in models.sources
    ]


def _oracle(models: ShapeModels, drafter, index: int, profile: AcceptanceProfile, num_draft_tokens: int, seed: int):
    reference = models.references[index]
    draws = profile.draw_accepted((1, reference.shape[1]), num_draft_tokens, seed + index)
    return ProfileOracleDrafter(drafter, reference, draws)


@torch.no_grad()
def speculative_run(
    models: ShapeModels,
    index: int,
    profile: AcceptanceProfile,
    num_draft_tokens: int,
    settings: MeasurementSettings,
    drafter=None,
    max_new_tokens: int | None = None,
):
    """One speculative `generate()` of sentence `index` with the oracle (`drafter`: what the oracle wraps)."""
    oracle = _oracle(models, drafter or models.drafter, index, profile, num_draft_tokens, settings.seed)
    kwargs = _greedy_kwargs(settings)
    if max_new_tokens is not None:
        kwargs["max_new_tokens"] = max_new_tokens
    return models.verifier.generate(
        **models.sources[index],
        **kwargs,
        custom_generate=speculative_generate,
        drafter=oracle,
        num_draft_tokens=num_draft_tokens,
        return_dict_in_generate=True,
    )


def _instrumented_pass(
    models: ShapeModels, profile: AcceptanceProfile, num_draft_tokens: int, settings: MeasurementSettings, **kwargs
) -> tuple[dict[str, float], int]:
    """Every sentence once with timers: wall, encoder, verifications, drafter set-up and calls, iterations, tokens;
    and how many outputs differ from greedy (with the default length)."""
    device = torch.device(settings.device)
    verifier = models.verifier
    timed_drafter = TimedDrafter(models.drafter, device)
    totals = dict.fromkeys(("wall", "iterations", "tokens"), 0.0)
    mismatches = 0
    with ModuleTimer([verifier.get_encoder()], device) as encoder, ModuleTimer([verifier], device) as forward:
        for index in range(len(models.sources)):
            run = functools.partial(
                speculative_run, models, index, profile, num_draft_tokens, settings, drafter=timed_drafter, **kwargs
            )
            seconds, output = timed(run, device)
            totals["wall"] += seconds
            totals["iterations"] += sum(output.speculative_stats.iterations)
            totals["tokens"] += sum(output.speculative_stats.generated_tokens)
            if not kwargs:
                mismatches += int(not torch.equal(output.sequences.cpu(), models.references[index]))
    totals["encoder"], totals["verify"], totals["verify_calls"] = encoder.total_s, forward.total_s, forward.calls[0]
    totals["drafter_init"] = timed_drafter.total_s - timed_drafter.propose_s
    totals["propose"], totals["propose_calls"] = timed_drafter.propose_s, timed_drafter.propose_calls
    return totals, mismatches


def measure_iteration_cost(
    models: ShapeModels, profile: AcceptanceProfile, num_draft_tokens: int, settings: MeasurementSettings
) -> tuple[IterationCost, int]:
    """
    The cost split of an iteration at `num_draft_tokens` drafts, from instrumented runs over every sentence (the
    median over `settings.calibration_rounds` rounds of each part).

    `generate()`'s own set-up and wrap-up are paid once per sentence, not per iteration: they are measured by a run of
    one new token (one verification of one token, no drafter call) and counted in the fixed cost, so that the
    projection does not scale them with the number of iterations.

    Returns:
        The `IterationCost` and how many outputs differed from greedy, over all rounds.
    """
    parts: dict[str, list[float]] = {"verify": [], "drafter": [], "loop": [], "fixed": [], "tok": []}
    mismatches = 0
    sentences = len(models.sources)
    for _ in range(settings.calibration_rounds):
        totals, wrong = _instrumented_pass(models, profile, num_draft_tokens, settings)
        mismatches += wrong
        one, _ = _instrumented_pass(models, profile, num_draft_tokens, settings, max_new_tokens=1)
        # per sentence: all of the one-token run but its encoder, drafter set-up and single verification
        per_call = max(0.0, one["wall"] - one["encoder"] - one["drafter_init"] - one["verify"]) / sentences
        iterations = totals["iterations"]
        parts["verify"].append(totals["verify"] / totals["verify_calls"])
        parts["drafter"].append(totals["propose"] / max(totals["propose_calls"], 1))
        rest = totals["wall"] - totals["encoder"] - totals["drafter_init"] - totals["verify"] - totals["propose"]
        parts["loop"].append(max(0.0, rest - sentences * per_call) / iterations)
        parts["fixed"].append((totals["encoder"] + totals["drafter_init"]) / sentences + per_call)
        parts["tok"].append(totals["tokens"] / iterations)
    cost = IterationCost(
        num_draft_tokens=num_draft_tokens,
        verify_s=median(parts["verify"]),
        drafter_s=median(parts["drafter"]),
        loop_s=median(parts["loop"]),
        fixed_s=median(parts["fixed"]),
        tokens_per_iteration=median(parts["tok"]),
    )
    return cost, mismatches


def time_direct_runs(
    models: ShapeModels,
    runs: dict[str, tuple[AcceptanceProfile, int]],
    settings: MeasurementSettings,
) -> dict[str, dict]:
    """
    Greedy and each speculative run (name → (profile, k)) timed interleaved over `settings.rounds` rounds, each
    round decoding every sentence with every strategy in a rotating order.

    Returns:
        Per name (and `"greedy"`): `times_s` (one total per round); for speculative runs also
        `tokens_per_iteration` and `mismatches` (outputs that differ from greedy).
    """
    device = torch.device(settings.device)
    greedy_kwargs = _greedy_kwargs(settings)

    def greedy(index: int):
        with torch.no_grad():
            return models.verifier.generate(**models.sources[index], **greedy_kwargs)

    runners: dict[str, Callable[[int], object]] = {"greedy": greedy}
    results: dict[str, dict] = {"greedy": {}}
    for name, (profile, num_draft_tokens) in runs.items():
        runners[name] = lambda index, profile=profile, num_draft_tokens=num_draft_tokens: speculative_run(
            models, index, profile, num_draft_tokens, settings
        )
        outputs = [runners[name](index) for index in range(len(models.sources))]  # warm-up, and the figures
        iterations = sum(sum(output.speculative_stats.iterations) for output in outputs)
        tokens = sum(sum(output.speculative_stats.generated_tokens) for output in outputs)
        mismatches = sum(
            not torch.equal(output.sequences.cpu(), reference)
            for output, reference in zip(outputs, models.references, strict=True)
        )
        results[name] = {"tokens_per_iteration": tokens / iterations, "mismatches": int(mismatches)}
    times = time_interleaved(runners, len(models.sources), settings.rounds, device, desc=f"{models.name}: timing")
    for name, values in times.items():
        results[name]["times_s"] = values
    return results
