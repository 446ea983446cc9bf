"""What speculative decoding would buy on a verifier, measured on this machine before any drafter is trained.

What speculative decoding pays is mostly a matter of the verifier's shape, the drafter's call cost, the machine and
the acceptance a drafter reaches; all but the last can be measured without trained weights. For each verifier shape
(a built-in shape of a well-known checkpoint, or any `config.json`), the estimator builds random weights, times greedy
`generate()`, measures the cost of a speculative iteration per k (verification, drafter call, loop) with a real
Spec-Drafter of the recommended design whose tokens an oracle sets to an acceptance profile, projects the speed-up per
k and Tok. (`projection.predicted_speedup`), and checks two projections against direct interleaved runs.

    python -m specdec_hf.estimation --verifier opus-mt-en-de bart-base --threads 2
"""

from .estimator import estimate_shape
from .measurement import IterationCost, MeasurementSettings, recommended_drafter
from .oracle import ProfileOracleDrafter
from .profile import AcceptanceProfile
from .projection import cost_in_greedy_steps, predicted_speedup
from .shapes import BUILTIN_SHAPES, load_verifier_config

__all__ = [
    "BUILTIN_SHAPES",
    "AcceptanceProfile",
    "IterationCost",
    "MeasurementSettings",
    "ProfileOracleDrafter",
    "cost_in_greedy_steps",
    "estimate_shape",
    "load_verifier_config",
    "predicted_speedup",
    "recommended_drafter",
]
