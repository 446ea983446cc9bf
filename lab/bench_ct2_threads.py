"""CTranslate2's speed by its intra-op thread count, beside HF greedy on the same verifier and sentences.

The main job times CTranslate2 as the CPU peer a user would pick instead; a user would also run it at its fastest
thread count, which need not be torch's. This converts the verifier once, starts one CTranslate2 worker per
(compute type, thread count) and times them with HF greedy (`--torch_threads`, plain linear layers) interleaved, one
sentence at a time in a rotating order: CTranslate2's own seconds (the pipe to its worker left out), HF's wall time.

    python -m lab.bench_ct2_threads --ct2_threads 1 2 --compute_types float32 int8 --repeats 5
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import time
from pathlib import Path

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from benchmarks._common import GREEDY_KWARGS, positive_int, print_header, read_sources, with_range
from specdec_hf.evaluation.ctranslate2_peer import (
    CTranslate2Worker,
    check_marian_layout,
    convert_verifier,
    decoding_options,
    forced_eos_token,
)
from specdec_hf.evaluation.interleaved import interleave, paired_speedups


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verifier", default="models/demo-en-de/verifier")
    parser.add_argument("--data", default="models/demo-en-de/heldout_test.jsonl")
    parser.add_argument("--limit", type=positive_int, default=100, help="Sentences (the first N rows).")
    parser.add_argument("--ct2_threads", type=positive_int, nargs="+", default=[1, 2])
    parser.add_argument("--compute_types", nargs="+", default=["float32", "int8"])
    parser.add_argument("--torch_threads", type=positive_int, default=2, help="HF greedy's threads.")
    parser.add_argument("--repeats", type=positive_int, default=5)
    parser.add_argument("--max_new_tokens", type=positive_int, default=GREEDY_KWARGS["max_new_tokens"])
    parser.add_argument("--output_dir", default="outputs/bench_ct2_threads", help="Where the conversion goes.")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.torch_threads)
    print_header(args.repeats)

    verifier = AutoModelForSeq2SeqLM.from_pretrained(args.verifier, dtype=torch.float32).eval()
    verifier.generation_config.max_length = None  # max_new_tokens sets the limit (no warning per call)
    tokenizer = AutoTokenizer.from_pretrained(args.verifier)
    check_marian_layout(verifier)
    converted = convert_verifier(args.verifier, Path(args.output_dir) / "ctranslate2")
    options, forced_eos = decoding_options(verifier, tokenizer), forced_eos_token(verifier, tokenizer)
    inputs = read_sources(args.data, tokenizer, args.limit)
    sources = [tokenizer.convert_ids_to_tokens(batch["input_ids"][0]) for batch in inputs]
    kwargs = {**GREEDY_KWARGS, "max_new_tokens": args.max_new_tokens}

    @torch.inference_mode()
    def hf_greedy(group: int) -> float:
        start = time.perf_counter()
        verifier.generate(**inputs[group], **kwargs)
        return time.perf_counter() - start

    def ct2(worker: CTranslate2Worker, group: int) -> float:
        return worker.translate([sources[group]], args.max_new_tokens)[1]

    measures = {f"HF greedy, {args.torch_threads} thread(s)": hf_greedy}
    with contextlib.ExitStack() as workers:  # the worker processes stop however the run ends
        for compute_type in args.compute_types:
            for threads in args.ct2_threads:
                worker = workers.enter_context(
                    CTranslate2Worker(converted, compute_type, threads, options, forced_eos)
                )
                measures[f"ct2 {compute_type}, {threads} thread(s)"] = functools.partial(ct2, worker)
        interleave(measures, num_groups=min(3, len(inputs)), repeats=1, desc="warm-up", disable_tqdm=True)
        times = interleave(measures, num_groups=len(inputs), repeats=args.repeats, desc="timed", disable_tqdm=True)

    reference = times[next(iter(measures))]
    print(f"{len(inputs)} sentences one at a time, max_new_tokens {args.max_new_tokens}; seconds over all of them")
    print("| decoder | time (s) | speed-up over HF greedy |")
    print("|---|---|---|")
    result = {}
    for name, values in times.items():
        speedups = paired_speedups(reference, values)
        result[name] = {"times_s": values, "speedups": speedups}
        print(f"| {name} | {with_range(values, 2)} | {with_range(speedups, 2, suffix='×')} |")
    return result


if __name__ == "__main__":
    main()
