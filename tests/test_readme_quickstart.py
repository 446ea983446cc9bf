"""The README's first code block runs as written (on the shipped demo pair), so the quickstart cannot rot."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_quickstart_runs_and_prints_a_translation_with_statistics(monkeypatch):
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```python\n(.*?)```", readme, flags=re.DOTALL)
    assert block is not None, "README.md has no python code block"
    monkeypatch.chdir(REPO)  # its paths are relative to the repository root, as for a user in a fresh clone
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block.group(1), "README.md quickstart", "exec"), {"__name__": "__quickstart__"})
    lines = printed.getvalue().strip().splitlines()
    assert len(lines) >= 2 and lines[0].strip(), printed.getvalue()
    assert re.search(r"tokens per iteration \d+\.\d+", printed.getvalue()), printed.getvalue()


def test_the_source_copy_example_runs_after_the_quickstart(monkeypatch):
    """The README's source-copy block, run in the quickstart's namespace (it reuses its verifier, drafter and
    inputs): both drafters give the verifier's greedy output."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)
    copy_block = next(block for block in blocks if "SourceCopyDrafter" in block)
    monkeypatch.chdir(REPO)
    namespace = {"__name__": "__quickstart__"}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(blocks[0], "README.md quickstart", "exec"), namespace)
        exec(compile(copy_block, "README.md source copy", "exec"), namespace)
    verifier, inputs = namespace["verifier"], namespace["inputs"]
    greedy = verifier.generate(**inputs, num_beams=1, do_sample=False, max_new_tokens=64)
    assert namespace["out"].tolist() == greedy.tolist()
    combined = verifier.generate(
        **inputs, drafter=namespace["copy_then_model"], num_beams=1, do_sample=False, max_new_tokens=64
    )
    assert combined.tolist() == greedy.tolist()


def test_the_ngram_store_example_runs_as_written(monkeypatch):
    """The README's n-gram store block, alone (it loads the summarization pair itself): greedy's output, drafted."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)
    store_block = next(block for block in blocks if "NgramStoreDrafter.from_pretrained" in block)
    monkeypatch.chdir(REPO)
    namespace = {"__name__": "__quickstart__"}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(store_block, "README.md n-gram store", "exec"), namespace)
    verifier, inputs = namespace["verifier"], namespace["inputs"]
    greedy = verifier.generate(**inputs, num_beams=1, do_sample=False, max_new_tokens=40)
    assert namespace["out"].tolist() == greedy.tolist() and printed.getvalue().strip()
