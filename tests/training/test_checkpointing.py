"""Checkpoints on several machines without a shared filesystem: every machine can resume from its own `latest`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# one process per "machine" (torchrun's node rank), each writing into a directory of its own: its own disk
_WORKER = """
import os, sys
from datetime import timedelta
from pathlib import Path
import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs, ProjectConfiguration
from specdec_hf.training import find_latest_checkpoint, load_checkpoint, save_checkpoint_atomically

output_dir = Path(sys.argv[1]) / f"machine{os.environ['GROUP_RANK']}"
output_dir.mkdir(parents=True)
accelerator = Accelerator(
    cpu=True,
    project_config=ProjectConfiguration(save_on_each_node=True),
    # a machine that fails must not leave the other waiting at a barrier for gloo's default half hour
    kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=60))],
)
model = torch.nn.Linear(2, 2)
model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
for step in (1, 2, 3):
    save_checkpoint_atomically(accelerator, output_dir, step, {"step": step}, keep=2)
latest = find_latest_checkpoint(output_dir)
assert latest is not None, f"no complete checkpoint in {sorted(p.name for p in output_dir.iterdir())}"
assert load_checkpoint(accelerator, latest)["step"] == 3
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_each_machine_renames_its_own_checkpoints(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(_WORKER)
    port = str(_free_port())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1", "PYTHONPATH": str(ROOT)}
    machines = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--node_rank",
                str(rank),
                "--nproc_per_node",
                "1",
                "--master_addr",
                "127.0.0.1",
                "--master_port",
                port,
                str(worker),
                str(tmp_path / "disks"),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for rank in (0, 1)
    ]
    try:
        outputs = [machine.communicate(timeout=90)[0] for machine in machines]
    finally:
        for machine in machines:
            machine.kill()
    assert [machine.returncode for machine in machines] == [0, 0], outputs[1][-3000:] + outputs[0][-3000:]
    for rank in (0, 1):
        disk = tmp_path / "disks" / f"machine{rank}"
        assert sorted(path.name for path in disk.iterdir()) == ["checkpoint-2", "checkpoint-3"]
        assert (disk / "checkpoint-3" / "training_state.json").is_file()
