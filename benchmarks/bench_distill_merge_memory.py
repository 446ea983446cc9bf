"""Peak memory of merging distillation shards: the corpus is never held in Python memory.

Writes `--rows` synthetic distilled rows (the columns `specdec_hf.distillation` writes, sentence lengths like WMT's)
as parquet shards of `--shard_size` rows, then merges them in a fresh process, twice: with the project's merge
(`datasets` memory-maps an Arrow cache and `save_to_disk` copies it batch by batch) and, for contrast, by reading
every shard into one in-memory table (what the merge did before). Prints each child's peak anonymous memory beside
the size of one shard in memory; every child imports the same modules, so the baseline child's figure is the floor.

    python benchmarks/bench_distill_merge_memory.py --rows 200000
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from _common import print_header

# Each merge runs in a fresh interpreter that samples its own anonymous resident memory (heap: Python objects and
# Arrow buffers) every 5 ms; file-backed pages of the memory-mapped cache count in RSS but are the page cache, and
# a child's ru_maxrss also keeps the peak of the parent it was forked from, so RSS is not reported.
SAMPLER = (
    "import threading, time, re\n"
    "peak = [0]\n"
    "def sample():\n"
    "    while True:\n"
    "        text = open('/proc/self/status').read()\n"
    "        peak[0] = max(peak[0], int(re.search(r'RssAnon:\\s+(\\d+)', text).group(1)))\n"
    "        time.sleep(0.005)\n"
    "threading.Thread(target=sample, daemon=True).start()\n"
)
REPORT = "\ntime.sleep(0.05); print(peak[0] / 1024)"
MERGES = {
    "project merge (memory-mapped)": (
        "from pathlib import Path; import sys; from specdec_hf.distillation import _merge_shards\n"
        "paths = sorted(Path(sys.argv[1]).glob('shard-*.parquet'))\n"
        "_merge_shards(paths, Path(sys.argv[2]))"
    ),
    "all shards in one in-memory table (before)": (
        "from pathlib import Path; import sys; import datasets, pyarrow as pa, pyarrow.parquet as pq\n"
        "import specdec_hf.distillation\n"
        "paths = sorted(Path(sys.argv[1]).glob('shard-*.parquet'))\n"
        "datasets.Dataset(pa.concat_tables([pq.read_table(p) for p in paths])).save_to_disk(sys.argv[2])"
    ),
    "baseline (imports only)": "import datasets, pyarrow, specdec_hf.distillation",
}


def write_shards(directory: Path, rows: int, shard_size: int, seed: int) -> int:
    """Synthetic shards; returns the in-memory size of one shard's table in bytes."""
    generator = random.Random(seed)
    words = [f"w{i}" for i in range(5000)]
    one_shard = 0
    for index, start in enumerate(range(0, rows, shard_size)):
        count = min(shard_size, rows - start)
        lengths = [generator.randint(5, 60) for _ in range(count)]
        table = pa.table(
            {
                "id": [str(start + i) for i in range(count)],
                "source": [" ".join(generator.choices(words, k=n)) for n in lengths],
                "target": [" ".join(generator.choices(words, k=n)) for n in lengths],
                "reference": [" ".join(generator.choices(words, k=n)) for n in lengths],
                "input_ids": [[generator.randrange(32000) for _ in range(n + 1)] for n in lengths],
                "target_ids": [[generator.randrange(32000) for _ in range(n + 2)] for n in lengths],
            }
        )
        pq.write_table(table, directory / f"shard-{index:05d}.parquet")
        one_shard = max(one_shard, table.nbytes)
    return one_shard


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--shard_size", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print_header(1)
    with tempfile.TemporaryDirectory() as tmp:
        shards = Path(tmp, "shards")
        shards.mkdir()
        one_shard = write_shards(shards, args.rows, args.shard_size, args.seed)
        total = sum(path.stat().st_size for path in shards.glob("*.parquet"))
        print(
            f"{args.rows} rows in {len(list(shards.glob('*.parquet')))} shards: {total / 2**20:.0f} MiB of parquet, "
            f"one shard {one_shard / 2**20:.1f} MiB in memory"
        )
        for name, code in MERGES.items():
            out = Path(tmp, name.split()[0])
            result = subprocess.run(
                [sys.executable, "-c", SAMPLER + code + REPORT, str(shards), str(out)],
                capture_output=True,
                text=True,
                check=True,
            )
            print(f"{name}: peak anonymous memory {float(result.stdout.split()[-1]):.0f} MiB")


if __name__ == "__main__":
    main()
