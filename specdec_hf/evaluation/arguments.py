"""Configuration of `evaluate.py`: a dataclass read from a YAML file, with command-line overrides.

The data side (which dataset, split, columns) is `specdec_hf.data.loading.DataArguments`; both are parsed together by
`parse_evaluation_arguments` (`--config file.yaml` plus `--name value` overrides).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config_parsing import parse_yaml_and_cli
from ..data.loading import DataArguments
from ..dtypes import TORCH_DTYPES
from .ctranslate2_peer import check_ctranslate2_available
from .strategies import STRATEGY_NAME_HELP, Strategy, resolve_strategies

__all__ = ["METRIC_NAMES", "EvaluationArguments", "parse_evaluation_arguments"]

METRIC_NAMES = ("bleu", "chrf", "rouge")
_DTYPES = tuple(TORCH_DTYPES)


@dataclass
class EvaluationArguments:
    """What `evaluate.py` compares, on which models, and how it measures.

    Every strategy decodes the same sources in one process; speed-ups are relative to greedy decoding measured in the
    same run at the same batch size.
    """

    # --- models ---
    verifier_name_or_path: str = field(metadata={"help": "The verifier: a Hub id or a local directory."})
    output_dir: str = field(
        default="runs/eval", metadata={"help": "Where results.json, results.md, the plot and generations/ go."}
    )
    tokenizer_name_or_path: str | None = field(default=None, metadata={"help": "Default: the verifier's tokenizer."})
    drafters: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Spec-Drafter directories or Hub ids (one or more); `source_copy` drafts by copying from the "
            "source (no weights), `source_copy+<drafter>` copies where the source continues a row and asks that "
            "drafter elsewhere."
        },
    )
    assistant_model: str | None = field(
        default=None, metadata={"help": "A small seq2seq model sharing the verifier's vocabulary, for `assisted`."}
    )

    # --- strategies ---
    strategies: list[str] = field(
        default_factory=lambda: ["greedy", "beam", "spec_k8_b1_t0"],
        metadata={"help": f"Strategies to compare: {STRATEGY_NAME_HELP}. Greedy is always run (the reference)."},
    )
    num_beams: int = field(default=5, metadata={"help": "Beams of the `beam` strategy."})
    prompt_lookup_num_tokens: int = field(default=10, metadata={"help": "Tokens drafted per `prompt_lookup` step."})
    max_matching_ngram_size: int = field(default=2, metadata={"help": "Longest n-gram `prompt_lookup` matches."})

    # --- generation ---
    batch_size: int = field(default=16, metadata={"help": "Rows per generate() call (assisted/prompt_lookup: 1)."})
    max_new_tokens: int = field(default=128, metadata={"help": "Generation length limit."})
    source_prefix: str | None = field(
        default=None, metadata={"help": "Prepended to every source; default: the T5 task prefix for T5 verifiers."}
    )
    max_source_length: int | None = field(
        default=None, metadata={"help": "Truncate sources to N tokens; default: what the verifier can read."}
    )
    sort_by_length: bool = field(
        default=True, metadata={"help": "Batch sources of similar length together (outputs keep the data order)."}
    )
    limit: int | None = field(default=None, metadata={"help": "Evaluate only the first N rows (quick runs)."})
    limit_seed: int | None = field(
        default=None,
        metadata={
            "help": "With `limit`: a random sample of N rows (drawn with this seed, kept in data order) instead of "
            "the first N, for splits ordered by origin (the Debian validation split starts with 251 dictionary rows)."
        },
    )

    # --- measurement ---
    metrics: list[str] = field(
        default_factory=lambda: list(METRIC_NAMES),
        metadata={"help": f"Quality metrics shown in the table: {', '.join(METRIC_NAMES)} (all are saved)."},
    )
    bleu_tokenize: str | None = field(
        default=None, metadata={"help": "sacrebleu tokenizer (13a, intl, zh, ja-mecab, ...); default: sacrebleu's."}
    )
    repeats: int = field(
        default=3,
        metadata={
            "help": "Timed repeats (median and range reported), after each strategy's instrumented warm-up pass. In "
            "each repeat every strategy decodes each batch in turn, interleaved with the others in a rotating order."
        },
    )
    sweep: bool = field(default=True, metadata={"help": "Run the batch-size sweep (latency-throughput curve)."})
    sweep_batch_sizes: list[int] = field(
        default_factory=lambda: [1, 4, 8, 16, 32], metadata={"help": "Batch sizes of the sweep."}
    )
    sweep_strategies: list[str] | None = field(
        default=None, metadata={"help": "Strategies of the sweep; default: greedy and every speculative one."}
    )
    sweep_max_samples: int | None = field(
        default=None, metadata={"help": "Rows used by the sweep (default: all evaluated rows)."}
    )
    measure_memory: bool = field(default=True, metadata={"help": "Measure peak memory on the first batch."})

    # --- runtime ---
    device: str = field(default="auto", metadata={"help": "auto, cpu, cuda or cuda:N."})
    dtype: str = field(default="float32", metadata={"help": f"Weights of every model: {', '.join(_DTYPES)}."})
    drafter_dtype: str | None = field(
        default=None,
        metadata={
            "help": "Weights of the drafters (default: `dtype`). Drafts are only proposals, so a bfloat16 drafter "
            "next to a float32 verifier leaves the output unchanged; whether it makes each draft cheaper depends on "
            "the CPU (docs/RESULTS.md)."
        },
    )
    attn_implementation: str | None = field(
        default=None,
        metadata={
            "help": "Attention kernel of the verifier and the assistant (`eager`, `sdpa`; default: transformers'). "
            "Greedy and every other strategy run on the same model, so speed-ups compare like with like."
        },
    )
    prepack_linear: bool = field(
        default=False,
        metadata={
            "help": "CPU only: run the linear layers of every model on weights packed once for a faster kernel "
            "(oneDNN's, or FBGEMM's float16 GEMM for float32 layers whose weights are float16 values) where that is "
            "measured faster on this machine, per layer signature and row count, then for the model's decoding steps "
            "as a whole (`specdec_hf.prepack_where_faster`; the choices are in results.json). Greedy and every other "
            "strategy run on the same models."
        },
    )
    num_threads: int | None = field(default=None, metadata={"help": "torch CPU threads (default: torch's)."})
    ct2_threads: int | None = field(
        default=None,
        metadata={
            "help": "CTranslate2's intra-op threads for the ct2 strategies (default: `num_threads`). Its best count "
            "can differ from torch's: give each runtime the one that is fastest on the machine."
        },
    )
    seed: int = field(default=0, metadata={"help": "Random seed (decoding itself is deterministic)."})
    check_only: bool = field(
        default=False,
        metadata={
            "help": "Run every check that needs no decoding (arguments, output directory, data, models and their "
            "compatibility) and stop before the first generate() call: a quick test of a config."
        },
    )
    disable_tqdm: bool = field(
        default=False, metadata={"help": "Hide the progress bars (they show only when stderr is a terminal anyway)."}
    )

    def __post_init__(self):
        for name in ("batch_size", "max_new_tokens", "repeats", "num_beams", "prompt_lookup_num_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be >= 1, got {getattr(self, name)}.")
        for name in ("limit", "max_source_length", "sweep_max_samples", "num_threads", "ct2_threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"`{name}` must be >= 1 (or unset), got {value}.")
        if self.limit_seed is not None and self.limit is None:
            raise ValueError("`limit_seed` draws `limit` rows at random: set `limit` too, or drop `limit_seed`.")
        if any(size < 1 for size in self.sweep_batch_sizes):
            raise ValueError(f"`sweep_batch_sizes` must all be >= 1, got {self.sweep_batch_sizes}.")
        if self.sweep and not self.sweep_batch_sizes:
            raise ValueError("`sweep_batch_sizes` is empty: give batch sizes or set `sweep: false`.")
        unknown_metrics = sorted(set(self.metrics) - set(METRIC_NAMES))
        if unknown_metrics:
            raise ValueError(f"unknown metric(s) {unknown_metrics}; valid: {', '.join(METRIC_NAMES)}.")
        if self.dtype not in _DTYPES:
            raise ValueError(f"`dtype` must be one of {', '.join(_DTYPES)}, got {self.dtype!r}.")
        if self.drafter_dtype is not None and self.drafter_dtype not in _DTYPES:
            raise ValueError(f"`drafter_dtype` must be one of {', '.join(_DTYPES)}, got {self.drafter_dtype!r}.")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ValueError(f"`device` must be auto, cpu, cuda or cuda:N, got {self.device!r}.")
        if self.prepack_linear and self.device != "cpu":
            raise ValueError(
                f"`prepack_linear` prepacks weights for oneDNN on the CPU, and `device` is {self.device!r} (`auto` "
                "picks a GPU where there is one): set `device: cpu`, or drop `prepack_linear`."
            )
        strategies = self.resolved_strategies  # raises for unknown names, missing drafters, bad indices
        if any(s.kind == "beam" and s.num_beams is None for s in strategies) and self.num_beams < 2:
            raise ValueError(f"the `beam` strategy needs `num_beams` >= 2, got {self.num_beams}.")
        if any(s.kind == "assisted" for s in strategies) and not self.assistant_model:
            raise ValueError("the `assisted` strategy needs `assistant_model` (a small seq2seq model path or id).")
        ct2 = [s.name for s in strategies if s.kind == "ctranslate2"]
        if ct2:
            if self.device != "cpu":
                raise ValueError(
                    f"the CTranslate2 strategies {ct2} run on the CPU, and `device` is {self.device!r} (`auto` picks "
                    "a GPU where there is one): set `device: cpu` so that every strategy runs on the same hardware."
                )
            try:
                check_ctranslate2_available()
            except ImportError as error:
                raise ValueError(f"strategies {ct2}: {error}") from None
        if self.sweep:
            self.resolved_sweep_strategies  # noqa: B018 -- validates the names

    @property
    def resolved_strategies(self) -> list[Strategy]:
        """The strategies to run, greedy first, speculative names expanded per drafter."""
        return resolve_strategies(list(self.strategies), len(self.drafters))

    @property
    def resolved_sweep_strategies(self) -> list[Strategy]:
        """The sweep's strategies: the named ones (which must be run strategies), else greedy and all speculative."""
        strategies = self.resolved_strategies
        if self.sweep_strategies is None:
            return [s for s in strategies if s.kind in ("greedy", "speculative")]
        by_name = {s.name: s for s in strategies}
        missing = [name for name in self.sweep_strategies if name not in by_name]
        if missing:
            raise ValueError(
                f"`sweep_strategies` {missing} are not among the evaluated strategies {sorted(by_name)}: "
                "add them to `strategies` first."
            )
        chosen = [by_name[name] for name in self.sweep_strategies]
        batch_one = [s.name for s in chosen if s.batch_one_only]
        if batch_one:
            raise ValueError(f"`sweep_strategies` {batch_one} run only at batch size 1 in transformers: drop them.")
        ct2 = [s.name for s in chosen if s.kind == "ctranslate2"]
        if ct2:
            raise ValueError(
                f"`sweep_strategies` {ct2}: the batch-size sweep times transformers' generate(): drop them."
            )
        return chosen


def parse_evaluation_arguments(argv: list[str] | None = None) -> tuple[EvaluationArguments, DataArguments]:
    """Parse `--config file.yaml` (values of both dataclasses) and command-line overrides."""
    evaluation_args, data_args = parse_yaml_and_cli([EvaluationArguments, DataArguments], argv)
    if evaluation_args.limit is not None and evaluation_args.limit_seed is None:
        data_args.max_samples = min(evaluation_args.limit, data_args.max_samples or evaluation_args.limit)
    return evaluation_args, data_args
