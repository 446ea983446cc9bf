"""Train a Spec-Drafter by distillation from its verifier (`accelerate launch train_drafter.py`).

Not implemented yet: the issue "Drafter training: dataset pipelines, sequence-level distillation and
`accelerate launch train_drafter.py`" completes it. Until then, `specdec_hf.training.fit_drafter_in_memory` trains a
drafter on in-memory verifier outputs (see examples/tiny_speculative_generation.py).
"""

import sys

if __name__ == "__main__":
    sys.exit(__doc__)
