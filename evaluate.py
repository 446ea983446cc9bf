"""Evaluate speculative decoding against greedy, beam search and HF assisted generation (`python evaluate.py`).

Not implemented yet: the issue "`evaluate.py`: quality and speed of speculative decoding side by side" completes it.
Until then, `benchmarks/bench_loop_overhead.py` measures speed against greedy `generate()`.
"""

import sys

if __name__ == "__main__":
    sys.exit(__doc__)
