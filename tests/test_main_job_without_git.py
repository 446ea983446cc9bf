"""The main job (`make demo`) depends on nothing but the working tree: its checks pass in a copy without `.git`.

`make demo-check` runs every command of `make demo` with `--check_only` (arguments, paths, data, models; no
decoding). Here it runs in a copy of the tree that has no `.git`, as a source archive or a copy of a shallow clone
would be, so that a step needing a tag, the history or the network fails in CI rather than at a user's last step.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_NOT_COPIED = (".git", ".venv", "outputs", "runs", "data", "logs", "__pycache__", ".pytest_cache", ".ruff_cache")


@pytest.fixture(scope="module")
def tree_without_git(tmp_path_factory):
    copy = tmp_path_factory.mktemp("clone") / "specdec_hf"
    shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(*_NOT_COPIED, "*.egg-info"))
    assert not (copy / ".git").exists()
    return copy


def _make(tree: Path, *targets: str) -> subprocess.CompletedProcess:
    # PY: this interpreter (the package is installed in it); the venv's stamp is made current so that `setup` is a
    # no-op in the copy
    stamp = tree / ".venv" / ".installed"
    stamp.parent.mkdir(exist_ok=True)
    stamp.touch()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GIT_DIR": str(tree / "no-such-git-dir")}
    return subprocess.run(
        ["make", "--no-print-directory", *targets, f"PY={sys.executable}"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_main_job_commands_name_no_git(tree_without_git):
    printed = _make(tree_without_git, "-n", "demo")
    assert printed.returncode == 0, printed.stderr
    commands = [line for line in printed.stdout.splitlines() if "evaluate" in line or "summary" in line]
    assert len(commands) >= 4, printed.stdout
    assert not [line for line in printed.stdout.splitlines() if "git" in line.split("#")[0]], printed.stdout


def test_main_job_checks_pass_without_git(tree_without_git):
    checked = _make(tree_without_git, "demo-check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # the evaluation passes: float32, peers and bfloat16 on en->de, summarization
    assert checked.stderr.count("checks passed") == 4, checked.stderr
    assert not (tree_without_git / "outputs" / "demo_en_de" / "results.json").exists()  # nothing decoded
