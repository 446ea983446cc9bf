"""Give a trained drafter a draft chain (`draft_chain_dim`), to be trained on from there.

    python scripts/add_draft_chain.py --drafter models/demo-en-de/drafter --draft_chain_dim 96 \
        --output_dir runs/drafter_v2_chain_init

The chain's output projection starts at zero, so the saved drafter drafts exactly what `--drafter` drafts until
`train_drafter.py --drafter_name_or_path <output_dir>` trains it (every weight, the chain's included).
`SpecDrafterModel.from_pretrained(path, draft_chain_dim=96)` gives the same model in memory (reporting the chain's
weights as missing); this script also refuses a drafter that has a chain already and saves the result, in float32
(the dtype training starts from, whatever the dtype `--drafter` was saved in).
"""

from __future__ import annotations

import argparse
import copy

import torch

from specdec_hf import SpecDrafterModel


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line: the trained drafter, the chain's width and the output directory."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafter", required=True, help="A trained drafter without a draft chain.")
    parser.add_argument("--draft_chain_dim", type=int, required=True, help="Width of the chain's hidden layer.")
    parser.add_argument("--output_dir", required=True)
    return parser.parse_args(argv)


@torch.no_grad()
def add_draft_chain(drafter: SpecDrafterModel, draft_chain_dim: int) -> SpecDrafterModel:
    """A copy of `drafter` with a new draft chain of width `draft_chain_dim` that drafts exactly as `drafter` does."""
    if drafter.config.draft_chain_dim is not None:
        raise ValueError(
            f"--drafter already has a draft chain (`draft_chain_dim={drafter.config.draft_chain_dim}`): train it on "
            "instead of adding another."
        )
    config = copy.deepcopy(drafter.config)
    config.draft_chain_dim = draft_chain_dim
    chained = SpecDrafterModel(config)
    missing, unexpected = chained.load_state_dict(drafter.state_dict(), strict=False)
    if unexpected or not all(name.startswith("draft_chain.") for name in missing):
        raise RuntimeError(f"weights do not line up: missing {missing}, unexpected {unexpected}")
    return chained.eval()


def main(argv: list[str] | None = None) -> None:
    """Load the drafter, add the chain and save."""
    args = parse_args(argv)
    drafter = SpecDrafterModel.from_pretrained(args.drafter, dtype=torch.float32)
    add_draft_chain(drafter, args.draft_chain_dim).save_pretrained(args.output_dir)
    print(f"saved {args.output_dir}: {args.drafter} with a draft chain of width {args.draft_chain_dim}")


if __name__ == "__main__":
    main()
