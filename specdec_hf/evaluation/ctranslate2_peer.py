"""CTranslate2 (https://github.com/OpenNMT/CTranslate2) as a peer: the CPU runtime a Marian user would pick instead.

The verifier is converted once by CTranslate2's own `TransformersConverter` and decoded greedily in a worker process
of its own. Two reasons for the process: CTranslate2 ships its own OpenMP runtime, whose threads keep spinning after
each call and slow the torch work that follows in the same process; and in the worker they are told not to spin
(`OMP_WAIT_POLICY=PASSIVE`), so that they do not slow the torch strategies timed right after them either. The worker
times each batch itself, and the interleaved timing counts those seconds, so the pipe between the processes is not in
the figures.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from .batching import Batch, restore_order
from .execution import StrategyRun
from .strategies import Strategy

__all__ = [
    "CTranslate2Worker",
    "check_ctranslate2_available",
    "check_marian_layout",
    "ct2_group_measure",
    "decoding_options",
    "convert_verifier",
    "force_eos_at_limit",
    "forced_eos_token",
    "run_ct2_strategy",
    "start_ct2_workers",
]

INSTALL_HINT = "pip install 'specdec_hf[peers]' (or: pip install ctranslate2)"


def check_ctranslate2_available() -> None:
    """
    Raises:
        ImportError: with the install command, when the `ctranslate2` package is missing.
    """
    if importlib.util.find_spec("ctranslate2") is None:
        raise ImportError(f"the ct2 strategies need CTranslate2, which is not installed: {INSTALL_HINT}")


def check_marian_layout(verifier) -> None:
    """
    CTranslate2's Marian converter assumes OPUS-MT's vocabulary layout: `<pad>` the last id, with a zero embedding.

    Raises:
        ValueError: for another model type, or a Marian model with `<pad>` elsewhere or a non-zero pad row, naming
            the fix (`specdec_hf.data.vocabulary_layout` re-lays a model).
    """
    config = verifier.config
    if config.model_type != "marian":
        return  # other families: the converter decides
    pad = config.pad_token_id
    if pad != config.vocab_size - 1:
        raise ValueError(
            f"CTranslate2 cannot convert this Marian verifier: its <pad> is id {pad}, but CTranslate2's converter "
            f"expects it last (id {config.vocab_size - 1}) with a zero embedding row, as in OPUS-MT checkpoints "
            "(it refuses with 'Source vocabulary 0 has size ... but the model expected ...'). Re-lay the model with "
            "specdec_hf.data.vocabulary_layout (pad_last_permutation, relayout_tokenizer, relayout_marian_model)."
        )
    row = verifier.get_input_embeddings().weight[pad]
    if bool(row.abs().max() > 0):
        raise ValueError(
            "CTranslate2 cannot convert this Marian verifier faithfully: its <pad> embedding row is not zero, "
            "while CTranslate2 treats <pad> as a zero vector (the decoder starts from it). Zero that row and retrain, "
            "as OPUS-MT checkpoints have it."
        )


def convert_verifier(model_dir: str | Path, output_dir: str | Path) -> Path:
    """
    Converts a saved verifier (model + tokenizer in `model_dir`) with CTranslate2's `TransformersConverter`, once:
    a conversion in `output_dir` made from the same files (`converted_from.json`) is reused.

    Returns:
        `Path`: the converted model's directory.
    """
    check_ctranslate2_available()
    from ctranslate2.converters import TransformersConverter

    output_dir = Path(output_dir)
    source = _conversion_source(model_dir)
    marker = output_dir / "converted_from.json"
    if (output_dir / "model.bin").is_file() and marker.is_file() and json.loads(marker.read_text()) == source:
        return output_dir
    TransformersConverter(str(model_dir)).convert(str(output_dir), force=True)
    marker.write_text(json.dumps(source) + "\n", encoding="utf-8")
    return output_dir


def _conversion_source(model_dir: str | Path) -> dict[str, str]:
    """What a conversion was made from: the path, and a digest of its config and weights files' sizes and times."""
    path = Path(model_dir)
    files = sorted(path.glob("*")) if path.is_dir() else []
    fingerprint = hashlib.sha256()
    for file in files:
        if file.is_file():
            stat = file.stat()
            fingerprint.update(f"{file.name}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return {"model": str(path.resolve()) if path.exists() else str(model_dir), "files": fingerprint.hexdigest()}


def decoding_options(verifier, tokenizer) -> dict[str, Any]:
    """
    CTranslate2's `translate_batch` options that decode like the verifier's greedy `generate()`.

    Single-token bans (`bad_words_ids`, e.g. OPUS-MT's `[[pad]]`) become `suppress_sequences`. `forced_eos_token_id`
    has no CTranslate2 option: the worker applies it to the hypotheses instead (`forced_eos_token`).

    Raises:
        ValueError: naming the generation settings CTranslate2 would not apply the same way.
    """
    config = verifier.generation_config
    unsupported = {
        name: getattr(config, name, None)
        for name in ("forced_bos_token_id", "no_repeat_ngram_size", "repetition_penalty", "min_length",
                     "min_new_tokens", "suppress_tokens", "begin_suppress_tokens", "sequence_bias")
    }  # fmt: skip
    unsupported = {name: value for name, value in unsupported.items() if value not in (None, 0, 1.0, [], {})}
    bad_words = getattr(config, "bad_words_ids", None) or []
    if any(len(sequence) != 1 for sequence in bad_words):
        unsupported["bad_words_ids"] = bad_words
    if unsupported:
        raise ValueError(
            f"the ct2 strategies decode greedily without the verifier's generation settings {unsupported}, so their "
            "outputs would not be comparable with greedy generate(): evaluate a verifier without them."
        )
    options: dict[str, Any] = {"beam_size": 1, "return_end_token": True}
    # CTranslate2's Marian vocabulary has no <pad> at all (its converter drops the last id), so it cannot emit it
    pad = verifier.config.pad_token_id if verifier.config.model_type == "marian" else None
    banned = [sequence for sequence in bad_words if list(sequence) != [pad]]
    if banned:
        options["suppress_sequences"] = [tokenizer.convert_ids_to_tokens(sequence) for sequence in banned]
    return options


def forced_eos_token(verifier, tokenizer) -> str | None:
    """The token string `generate()` forces as the last new token at the length limit (the generation config's
    `forced_eos_token_id`, as Marian checkpoints set it), or `None`. With several ids the forced scores tie, and
    greedy decoding takes the lowest id."""
    forced = getattr(verifier.generation_config, "forced_eos_token_id", None)
    if forced is None or (isinstance(forced, (list, tuple)) and not forced):
        return None
    forced = min(forced) if isinstance(forced, (list, tuple)) else forced
    return tokenizer.convert_ids_to_tokens(int(forced))


def force_eos_at_limit(
    hypotheses: list[list[str]], max_decoding_length: int, eos_token: str | None
) -> list[list[str]]:
    """What `ForcedEOSTokenLogitsProcessor` does to greedy decoding, applied to finished hypotheses: a hypothesis that
    reached `max_decoding_length` tokens ends with `eos_token` in place of its last one (the earlier tokens are the
    same, as the processor acts at the last step only). The hypotheses must carry their end token where decoding
    ended there (`return_end_token=True`, as `decoding_options` sets): a row that ended by itself is then shorter
    than the limit or already ends with it."""
    if eos_token is None:
        return hypotheses
    return [
        [*tokens[: max_decoding_length - 1], eos_token] if len(tokens) >= max_decoding_length else tokens
        for tokens in hypotheses
    ]


def _worker_main(connection, model_dir: str, compute_type: str, threads: int, options: dict[str, Any]) -> None:
    import ctranslate2

    translator = ctranslate2.Translator(model_dir, device="cpu", compute_type=compute_type, intra_threads=threads)
    connection.send("ready")
    while True:
        message = connection.recv()
        if message is None:
            break
        sources, max_decoding_length = message
        start = time.perf_counter()
        results = translator.translate_batch(sources, max_decoding_length=max_decoding_length, **options)
        seconds = time.perf_counter() - start
        connection.send(([result.hypotheses[0] for result in results], seconds))


class CTranslate2Worker:
    """
    A CTranslate2 translator in a process of its own (spawned, with passive OpenMP waiting).

    Args:
        model_dir (`str` or `Path`): A converted model (`convert_verifier`).
        compute_type (`str`): `float32`, `int8`, `int8_float32`, ... (`ctranslate2.get_supported_compute_types`).
        threads (`int`): CTranslate2's intra-op threads.
        options (`dict`, *optional*): `translate_batch` options (`decoding_options`); default greedy.
        forced_eos (`str`, *optional*): The token forced as the last one at the length limit (`forced_eos_token`).

    Use as a context manager; `translate(sources, max_decoding_length)` returns the greedy hypotheses (token strings,
    ending with the end token where decoding ended there) and the seconds CTranslate2 took.
    """

    def __init__(
        self,
        model_dir: str | Path,
        compute_type: str,
        threads: int,
        options: dict[str, Any] | None = None,
        forced_eos: str | None = None,
    ):
        check_ctranslate2_available()
        import ctranslate2

        supported = ctranslate2.get_supported_compute_types("cpu")
        if compute_type not in supported:
            raise ValueError(
                f"CTranslate2 compute type {compute_type!r} is not supported on this CPU ({sorted(supported)})"
            )
        self.model_dir, self.compute_type, self.threads = str(model_dir), compute_type, threads
        self.options = options or {"beam_size": 1, "return_end_token": True}
        self.forced_eos = forced_eos
        self._process: Any = None
        self._connection: Any = None

    def __enter__(self) -> CTranslate2Worker:
        context = multiprocessing.get_context("spawn")
        self._connection, child = context.Pipe()
        saved = {name: os.environ.get(name) for name in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
        # the child inherits the environment at spawn: its OpenMP threads sleep as soon as a call ends
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        os.environ["OMP_NUM_THREADS"] = str(self.threads)
        try:
            arguments = (child, self.model_dir, self.compute_type, self.threads, self.options)
            self._process = context.Process(target=_worker_main, args=arguments, daemon=True)
            self._process.start()
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        child.close()  # the child's end lives in the child only: its death then ends our recv() with EOFError
        try:
            ready = self._connection.recv()
        except EOFError:
            ready = None
        if ready != "ready":
            self._stop()
            raise RuntimeError(
                f"the CTranslate2 worker for {self.model_dir} ({self.compute_type}) did not start: see its error above"
            )
        return self

    def translate(self, sources: list[list[str]], max_decoding_length: int) -> tuple[list[list[str]], float]:
        """Greedy hypotheses of a batch of tokenised sources, and CTranslate2's own seconds for it."""
        self._connection.send((sources, max_decoding_length))
        try:
            hypotheses, seconds = self._connection.recv()
        except EOFError:
            raise RuntimeError(f"the CTranslate2 worker ({self.compute_type}) stopped: see its error above") from None
        return force_eos_at_limit(hypotheses, max_decoding_length, self.forced_eos), seconds

    def __exit__(self, *exc_info) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._process is None:
            return
        try:
            self._connection.send(None)
        except (BrokenPipeError, OSError):  # the worker is already gone
            pass
        self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.kill()
        self._process = None


def start_ct2_workers(
    strategies: Sequence[Strategy],
    verifier,
    tokenizer,
    model_dir: str,
    output_dir: Path,
    threads: int,
    stack: ExitStack,
) -> dict[str, CTranslate2Worker]:
    """
    Converts the verifier once (into `output_dir/ctranslate2`) and starts one worker per CTranslate2 strategy; the
    workers stop when `stack` closes.

    Raises:
        ValueError: when the verifier's layout is one CTranslate2 cannot convert (`check_marian_layout`), or its
            generation settings ones CTranslate2 would not apply (`decoding_options`).
    """
    check_marian_layout(verifier)
    options = decoding_options(verifier, tokenizer)
    forced_eos = forced_eos_token(verifier, tokenizer)
    converted = convert_verifier(model_dir, output_dir / "ctranslate2")
    return {
        strategy.name: stack.enter_context(
            CTranslate2Worker(converted, strategy.compute_type, threads, options, forced_eos)
        )
        for strategy in strategies
    }


def _sources(tokenizer, batch: Batch) -> list[list[str]]:
    """The batch's source tokens as CTranslate2 reads them (padding dropped)."""
    lengths = batch.attention_mask.sum(dim=1).tolist()
    return [
        tokenizer.convert_ids_to_tokens(ids[:length])
        for ids, length in zip(batch.input_ids.tolist(), lengths, strict=True)
    ]


def ct2_group_measure(
    worker: CTranslate2Worker, tokenizer, groups: Sequence[Sequence[Batch]], max_new_tokens: int
) -> Callable[[int], float]:
    """`measure(g)`: decode the batches of `groups[g]` with the worker; CTranslate2's own seconds for them (the pipe
    to the worker process left out), the unit of the interleaved timing."""
    sources = [[_sources(tokenizer, batch) for batch in group] for group in groups]

    def measure(group: int) -> float:
        return sum(worker.translate(batch, max_new_tokens)[1] for batch in sources[group])

    return measure


def run_ct2_strategy(
    strategy: Strategy, worker: CTranslate2Worker, tokenizer, batches: Sequence[Batch], max_new_tokens: int
) -> StrategyRun:
    """
    One pass over `batches` with CTranslate2 (the strategy's warm-up and outputs), as a `StrategyRun`: generated ids
    per dataset row, up to and including EOS, like the other strategies'.
    """
    per_batch, seconds = [], 0.0
    for batch in batches:
        hypotheses, batch_seconds = worker.translate(_sources(tokenizer, batch), max_new_tokens)
        per_batch.append([tokenizer.convert_tokens_to_ids(tokens) for tokens in hypotheses])
        seconds += batch_seconds
    return StrategyRun(
        strategy=strategy,
        batch_size=max(len(batch.rows) for batch in batches),
        sequences=restore_order(batches, per_batch),
        instrumented_s=seconds,
        verifier_s=seconds,
        verifier_decoder_calls=0,
        generation_kwargs={
            "compute_type": strategy.compute_type,
            "max_decoding_length": max_new_tokens,
            "intra_threads": worker.threads,
        },
    )
