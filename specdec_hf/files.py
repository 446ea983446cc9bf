"""Writing files so that a reader never sees half of one: written under a temporary name, then renamed."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["write_json_atomic"]


def write_json_atomic(path: str | os.PathLike, content: Any) -> Path:
    """Write `content` as indented UTF-8 JSON to `path` (parent directories created), atomically: a temporary file
    next to it is renamed over it, so a killed run leaves the old file or the new one, never a partial one.

    Returns:
        `Path`: `path`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(content, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    os.replace(temporary, path)
    return path
