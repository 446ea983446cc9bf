"""The package's layering: the model (`specdec_hf.models`) depends on nothing of decoding, as a transformers model
does not depend on `transformers.generation`."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "specdec_hf"


def _imported_modules(path: Path) -> set[str]:
    """Absolute names of the modules `path` imports (relative imports resolved against its package)."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def test_the_model_imports_nothing_of_decoding():
    modules = sorted((PACKAGE / "models").rglob("*.py"))
    assert len(modules) >= 4
    for path in modules:
        forbidden = [
            name
            for name in _imported_modules(path)
            if name.startswith(("specdec_hf.generation", "specdec_hf.drafting", "specdec_hf.acceptance"))
        ]
        assert not forbidden, f"{path.name} imports {forbidden}"


def test_the_check_sees_relative_imports():
    """Relative imports (`from ..drafting import ...` in `specdec_hf.generation`) resolve to absolute names, so the
    check above can fail."""
    imported = _imported_modules(PACKAGE / "generation" / "spec_drafter_adapter.py")
    assert "specdec_hf.drafting" in imported and "specdec_hf.models" in imported
