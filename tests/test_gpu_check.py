"""benchmarks/gpu_check.py in its CPU mode (tiny models): every check runs and passes, so the script cannot rot."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_cpu_mode_runs_every_check_and_writes_both_reports(tmp_path):
    gpu_check = load_gpu_check()
    assert gpu_check.main(["--device", "cpu", "--output_dir", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    assert set(results["checks"]) == {"exactness", "modes", "host_syncs", "timing", "estimator", "training"}
    assert all(entry["status"] == "passed" for entry in results["checks"].values())
    exactness = results["checks"]["exactness"]["details"]
    assert all(entry["identical"] == entry["rows"] for entry in exactness.values())
    assert results["checks"]["training"]["details"]["final_step"] == 20
    host_syncs = results["checks"]["host_syncs"]["details"]
    assert host_syncs["greedy_batch4"]["project_max_per_iteration"] <= gpu_check.GREEDY_SYNC_BUDGET
    assert "| exactness | passed |" in (tmp_path / "gpu_check.md").read_text()
