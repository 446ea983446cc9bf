"""Packaging: every third-party import is a declared dependency (and every dependency is used), the licence is an
SPDX expression, and the wheel builds without warnings and works installed outside the repository (slow)."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# code that ships or that users run, and the code that only developers run (which may also use the dev extra)
RUNTIME_CODE = ("specdec_hf", "train_drafter.py", "evaluate.py", "scripts", "benchmarks")
DEVELOPER_CODE = ("tests", "examples")


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_names(requirements: list[str]) -> set[str]:
    return {
        _normalized(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1)) for requirement in requirements
    }


def _python_files(roots: tuple[str, ...]) -> list[Path]:
    return [
        path for root in roots for path in ([ROOT / root] if root.endswith(".py") else (ROOT / root).rglob("*.py"))
    ]


def _imported_modules(files: list[Path]) -> dict[str, set[str]]:
    """Top-level module names imported anywhere in `files` (in functions too), with the files importing them."""
    modules: dict[str, set[str]] = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                modules.setdefault(name.split(".")[0], set()).add(str(path.relative_to(ROOT)))
    return modules


def _local_modules() -> set[str]:
    """The repository's own modules: its packages and every script or test module (imported by path)."""
    files = _python_files(RUNTIME_CODE + DEVELOPER_CODE)
    return {path.stem for path in files} | {path.parent.name for path in files if path.name == "__init__.py"}


def _third_party_distributions(roots: tuple[str, ...]) -> dict[str, set[str]]:
    """Distribution name -> files importing it, for every import that is neither the standard library nor local."""
    distributions_of = importlib.metadata.packages_distributions()
    local = _local_modules()
    found: dict[str, set[str]] = {}
    for module, files in _imported_modules(_python_files(roots)).items():
        if module in sys.stdlib_module_names or module in local or module == "__future__":
            continue
        # an optional dependency that is not installed here is taken to be named as it is imported
        distribution = distributions_of.get(module, [module])[0]
        found.setdefault(_normalized(distribution), set()).update(files)
    return found


def test_every_third_party_import_is_a_declared_dependency():
    """pyarrow and huggingface_hub were imported but arrived only as dependencies of datasets and transformers."""
    runtime = _requirement_names(PYPROJECT["project"]["dependencies"])
    extras = PYPROJECT["project"]["optional-dependencies"]
    # an extra such as `peers` declares what optional code imports (behind a check that it is installed)
    optional = set().union(*(_requirement_names(extras[name]) for name in extras if name != "dev"))
    developer = runtime | optional | _requirement_names(extras["dev"])
    used = _third_party_distributions(RUNTIME_CODE)
    undeclared = {name: sorted(files) for name, files in used.items() if name not in runtime | optional}
    assert not undeclared, f"imported but not in [project] dependencies (or a non-dev extra): {undeclared}"
    used_by_developers = _third_party_distributions(DEVELOPER_CODE)
    undeclared = {name: sorted(files) for name, files in used_by_developers.items() if name not in developer}
    assert not undeclared, (
        f"imported by tests or examples but not declared (dependencies or the dev extra): {undeclared}"
    )
    unused = runtime - set(used)
    assert not unused, f"declared dependencies that no code imports: {sorted(unused)}"


def test_license_is_an_spdx_expression_with_its_file():
    """A TOML table made setuptools warn that such builds stop being supported by 2027-02-18."""
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] and all((ROOT / name).is_file() for name in project["license-files"])


@pytest.mark.slow
def test_wheel_builds_without_warnings_and_generates_installed_outside_the_repository(tmp_path):
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} predates SPDX licences (install the dev extra)")
    source = tmp_path / "source"  # a copy, so that the build leaves nothing in the repository
    source.mkdir()
    for name in {"pyproject.toml", PYPROJECT["project"]["readme"], *PYPROJECT["project"]["license-files"]}:
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "specdec_hf", source / "specdec_hf", ignore=shutil.ignore_patterns("__pycache__"))
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v", "-w", str(tmp_path), "."],
        cwd=source,
        env=environment,
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    complaints = [
        line for line in (build.stdout + build.stderr).splitlines() if re.search(r"warn|deprecat", line, re.I)
    ]
    assert not complaints, "\n".join(complaints)
    (wheel,) = tmp_path.glob("specdec_hf-*.whl")
    target = tmp_path / "site"
    install = [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(wheel)]
    subprocess.run(install, check=True, capture_output=True)
    script = textwrap.dedent(
        f"""
        import torch
        from transformers import BartConfig, BartForConditionalGeneration

        import specdec_hf
        from specdec_hf import SpecDrafterModel, enable_speculative_decoding

        assert specdec_hf.__file__.startswith({str(target)!r}), specdec_hf.__file__
        torch.manual_seed(0)
        config = BartConfig(
            vocab_size=99, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
            init_std=0.2, forced_eos_token_id=None,
        )
        verifier = BartForConditionalGeneration(config).eval()
        drafter = SpecDrafterModel.from_verifier(verifier, max_draft_tokens=4, decoder_layers=1).eval()
        inputs = torch.randint(4, 99, (2, 9))
        greedy = verifier.generate(inputs, do_sample=False, max_new_tokens=12)
        speculative = enable_speculative_decoding(verifier).generate(
            inputs, do_sample=False, max_new_tokens=12, drafter=drafter
        )
        assert torch.equal(speculative, greedy)
        print("generated", tuple(speculative.shape), "from", specdec_hf.__file__)
        """
    )
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    run = subprocess.run(
        [sys.executable, "-c", script],
        cwd=outside,
        env={**environment, "PYTHONPATH": str(target), "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "generated (2," in run.stdout
