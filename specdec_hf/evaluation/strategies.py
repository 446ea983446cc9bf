"""The decoding strategies `evaluate.py` compares, named in the config, and the `generate()` arguments of each.

Names:

* `greedy`: `generate(do_sample=False, num_beams=1)`, the reference of speed-up and identical-to-greedy;
* `beam`: beam search with `num_beams` beams; `beam<n>` (e.g. `beam3`): with n beams, for a sweep of widths;
* `spec_k<k>_b<β>_t<τ>[_c<c>]` (e.g. `spec_k8_b1_t0`, `spec_k10_b5_t3.5`, `spec_k8_b1_t0_c0.2`): Speculative
  Decoding (Xia et al., 2023, arXiv 2203.16487) with k drafts per iteration, top-β and tolerance τ, and with `_c<c>`
  verifying only the drafts whose running drafter confidence stays at or above c (`draft_confidence_threshold`); with
  several drafters it runs with each (the result names get `_d<i>`), and `spec_..._d<i>` picks drafter i only;
  `spec_kauto_...` chooses k per iteration (`num_draft_tokens="auto"`, `specdec_hf.generation.draft_length`);
* `assisted`: transformers' assisted generation with an autoregressive `assistant_model` (batch size 1 only);
* `ct2`, `ct2_int8`, `ct2_int8_float32`: the verifier converted to CTranslate2 and decoded greedily by it, with the
  weights in float32, int8 or int8 with float32 activations (`specdec_hf.evaluation.ctranslate2_peer`; CPU only);
* `prompt_lookup`: transformers' prompt-lookup decoding (`prompt_lookup_num_tokens`; batch size 1 only). With an
  encoder-decoder model transformers matches n-grams in the decoder's own tokens so far, not in the source.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from ..generation import speculative_generate
from ..generation.draft_length import AUTO

__all__ = [
    "BATCH_ONE_KINDS",
    "STRATEGY_NAME_HELP",
    "Strategy",
    "generation_kwargs",
    "parse_strategy",
    "resolve_strategies",
]

STRATEGY_NAME_HELP = (
    "greedy, beam, beam<n>, spec_k<k>_b<beta>_t<tau>[_c<confidence threshold>][_d<drafter index>] (e.g. spec_k8_b1_t0, "
    "spec_k10_b5_t3.5, spec_k8_b1_t0_c0.2; k may be `auto`: spec_kauto_b1_t0), "
    "assisted, prompt_lookup, ct2, ct2_int8, ct2_int8_float32"
)
_PLAIN_KINDS = ("greedy", "beam", "assisted", "prompt_lookup")
# CTranslate2 strategies: name -> compute type (the weights are converted once, quantised when loaded)
CT2_COMPUTE_TYPES = {"ct2": "float32", "ct2_int8": "int8", "ct2_int8_float32": "int8_float32"}
_BEAM_NAME = re.compile(r"^beam(?P<beams>\d+)$")
_SPECULATIVE_NAME = re.compile(
    r"^spec_k(?P<k>\d+|auto)_b(?P<beta>\d+)_t(?P<tau>\d+(?:\.\d+)?)(?:_c(?P<confidence>\d+(?:\.\d+)?))?"
    r"(?:_d(?P<drafter>\d+))?$"
)
# transformers' assisted generation and prompt lookup refuse batches of more than one row
BATCH_ONE_KINDS = ("assisted", "prompt_lookup")


@dataclass(frozen=True)
class Strategy:
    """One decoding strategy to evaluate.

    Args:
        name (`str`): Its name in the config and in every output.
        kind (`str`): `"greedy"`, `"beam"`, `"speculative"`, `"assisted"`, `"prompt_lookup"` or `"ctranslate2"`.
        num_draft_tokens, beta, tau: The speculative settings (k, β, τ; k an int or `"auto"`); `None` for other kinds.
        confidence_threshold (`float`, *optional*): `draft_confidence_threshold` of a speculative strategy.
        drafter_index (`int`, *optional*): Which of the configured drafters; `None` for other kinds.
        compute_type (`str`, *optional*): CTranslate2's compute type of a `ctranslate2` strategy.
        num_beams (`int`, *optional*): The beams of a `beam<n>` strategy; `None`: the run's `num_beams`.
    """

    name: str
    kind: str
    num_draft_tokens: int | str | None = None
    beta: int | None = None
    tau: float | None = None
    drafter_index: int | None = None
    confidence_threshold: float | None = None
    compute_type: str | None = None
    num_beams: int | None = None

    @property
    def batch_one_only(self) -> bool:
        """Whether transformers runs it only at batch size 1."""
        return self.kind in BATCH_ONE_KINDS


def parse_strategy(name: str) -> Strategy:
    """Parse one strategy name (a speculative one keeps `drafter_index=None` unless it names `_d<i>`).

    Raises:
        ValueError: for an unknown name, listing the valid ones.
    """
    if name in _PLAIN_KINDS:
        return Strategy(name=name, kind=name)
    if name in CT2_COMPUTE_TYPES:
        return Strategy(name=name, kind="ctranslate2", compute_type=CT2_COMPUTE_TYPES[name])
    beam = _BEAM_NAME.match(name)
    if beam is not None:
        if int(beam["beams"]) < 2:
            raise ValueError(f"strategy {name!r}: beam search needs at least 2 beams (`greedy` is 1).")
        return Strategy(name=name, kind="beam", num_beams=int(beam["beams"]))
    match = _SPECULATIVE_NAME.match(name)
    if match is None:
        raise ValueError(f"unknown strategy {name!r}; valid names: {STRATEGY_NAME_HELP}.")
    drafter, confidence = match["drafter"], match["confidence"]
    if confidence is not None and float(confidence) > 1:
        raise ValueError(f"strategy {name!r}: the confidence threshold `_c` must be in [0, 1], got {confidence}.")
    return Strategy(
        name=name,
        kind="speculative",
        num_draft_tokens=match["k"] if match["k"] == AUTO else int(match["k"]),
        beta=int(match["beta"]),
        tau=float(match["tau"]),
        drafter_index=None if drafter is None else int(drafter),
        confidence_threshold=None if confidence is None else float(confidence),
    )


def resolve_strategies(names: list[str], num_drafters: int) -> list[Strategy]:
    """The strategies to run, greedy first (added if missing: it is the reference), each name once.

    A speculative name without `_d<i>` becomes one strategy per drafter: the name itself with one drafter,
    `<name>_d<i>` with several.

    Raises:
        ValueError: for unknown or repeated names, speculative names without drafters, or a drafter index out of range.
    """
    if not names:
        raise ValueError(f"`strategies` is empty; valid names: {STRATEGY_NAME_HELP}.")
    unknown = []
    parsed = []
    for name in names:
        try:
            parsed.append(parse_strategy(name))
        except ValueError:
            unknown.append(name)
    if unknown:
        raise ValueError(f"unknown strategy name(s) {unknown}; valid names: {STRATEGY_NAME_HELP}.")
    if any(strategy.kind == "speculative" for strategy in parsed) and num_drafters == 0:
        raise ValueError("speculative strategies (spec_...) need at least one drafter: set `drafters` (paths).")
    if not any(strategy.kind == "greedy" for strategy in parsed):
        parsed.insert(0, Strategy(name="greedy", kind="greedy"))
    resolved: list[Strategy] = []
    for strategy in parsed:
        if strategy.kind != "speculative":
            resolved.append(strategy)
        elif strategy.drafter_index is not None:
            if strategy.drafter_index >= num_drafters:
                raise ValueError(
                    f"strategy {strategy.name!r} names drafter {strategy.drafter_index}, but only {num_drafters} "
                    f"drafter(s) are configured (indices 0 to {num_drafters - 1})."
                )
            resolved.append(strategy)
        else:
            for index in range(num_drafters):
                name = strategy.name if num_drafters == 1 else f"{strategy.name}_d{index}"
                resolved.append(dataclasses.replace(strategy, name=name, drafter_index=index))
    names_seen = [strategy.name for strategy in resolved]
    repeated = sorted({name for name in names_seen if names_seen.count(name) > 1})
    if repeated:
        raise ValueError(f"strategy name(s) {repeated} appear more than once in `strategies`.")
    resolved.sort(key=lambda strategy: strategy.kind != "greedy")  # stable: greedy first, the rest in config order
    return resolved


def generation_kwargs(
    strategy: Strategy,
    max_new_tokens: int,
    num_beams: int = 5,
    drafter: Any = None,
    assistant_model: Any = None,
    prompt_lookup_num_tokens: int = 10,
    max_matching_ngram_size: int = 2,
) -> dict[str, Any]:
    """The keyword arguments of `verifier.generate(**inputs, **kwargs)` for `strategy`.

    Every strategy decodes deterministically (`do_sample=False`) whatever the verifier's generation config says;
    only `beam` uses more than one beam. Speculative decoding returns a dict with `speculative_stats`.
    """
    kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens, "do_sample": False, "num_beams": 1}
    if strategy.kind == "beam":
        kwargs["num_beams"] = strategy.num_beams or num_beams
    elif strategy.kind == "speculative":
        if drafter is None:
            raise ValueError(f"strategy {strategy.name!r} needs a drafter.")
        kwargs.update(
            custom_generate=speculative_generate,
            drafter=drafter,
            num_draft_tokens=strategy.num_draft_tokens,
            beta=strategy.beta,
            tau=strategy.tau,
            return_dict_in_generate=True,
        )
        if strategy.confidence_threshold is not None:
            kwargs["draft_confidence_threshold"] = strategy.confidence_threshold
    elif strategy.kind == "assisted":
        if assistant_model is None:
            raise ValueError("strategy 'assisted' needs `assistant_model`.")
        kwargs["assistant_model"] = assistant_model
    elif strategy.kind == "prompt_lookup":
        kwargs.update(
            prompt_lookup_num_tokens=prompt_lookup_num_tokens, max_matching_ngram_size=max_matching_ngram_size
        )
    return kwargs
