"""Start the drafter of a grown verifier (demo verifier v2) from the trained drafter of the verifier it grew from.

    python scripts/grow_demo_drafter.py --drafter runs/demo_pair_v1/drafter --old_verifier runs/demo_pair_v1/verifier \
        --verifier runs/demo_verifier_v2/best --verifier_state_layers 2,4,6 --decoder_layers 2 \
        --output_dir runs/drafter_v2_init

The grown verifier shares the old one's tokenizer, re-laid with `<pad>` last, and its width. The drafter is re-laid by
the same permutation (checked against the new verifier's tokenizer), reads the new verifier's `verifier_state_layers`
(as many as before: its projection's width is kept), may be made deeper (`--decoder_layers`), and is saved for
`train_drafter.py --drafter_name_or_path`.
"""

from __future__ import annotations

import argparse
import copy

import torch
from transformers import AutoConfig, AutoTokenizer

from specdec_hf import SpecDrafterModel
from specdec_hf.data.vocabulary_layout import pad_last_permutation, relayout_spec_drafter, relayout_tokenizer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line: the trained drafter, the two verifiers, the new state layers and the output directory."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafter", required=True, help="The trained drafter of the old verifier.")
    parser.add_argument("--old_verifier", required=True, help="The old verifier (its tokenizer is read).")
    parser.add_argument("--verifier", required=True, help="The grown verifier (tokenizer and config are read).")
    parser.add_argument(
        "--verifier_state_layers",
        required=True,
        help="Comma-separated decoder layers of the new verifier the drafter reads, as many as the old drafter read.",
    )
    parser.add_argument(
        "--decoder_layers",
        type=int,
        default=None,
        help="Deepen the drafter's decoder to this many layers (default: keep its depth); see deepen_decoder.",
    )
    parser.add_argument("--output_dir", required=True)
    return parser.parse_args(argv)


@torch.no_grad()
def deepen_decoder(drafter: SpecDrafterModel, num_layers: int) -> SpecDrafterModel:
    """
    Returns a drafter with `num_layers` decoder layers that computes exactly what `drafter` computes.

    The drafter's layers are pre-LayerNorm residual blocks, so a block whose output projections (the attentions'
    `out_proj` and the MLP's `fc2`) are zero adds nothing: the new layers are copies of the last one with those
    projections zeroed, appended after it, and training grows them from there (their inputs are not zero, so the
    zeroed weights get gradient).
    """
    old_layers = drafter.config.decoder_layers
    if num_layers < old_layers:
        raise ValueError(f"--decoder_layers must be at least the drafter's {old_layers}, got {num_layers}")
    config = copy.deepcopy(drafter.config)
    config.decoder_layers = num_layers
    deeper = SpecDrafterModel(config)
    state = drafter.state_dict()
    last = f"decoder.layers.{old_layers - 1}."
    for index in range(old_layers, num_layers):
        for name, value in list(state.items()):
            if name.startswith(last):
                new_name = f"decoder.layers.{index}." + name[len(last) :]
                zeroed = name.endswith(("out_proj.weight", "out_proj.bias", "fc2.weight", "fc2.bias"))
                state[new_name] = torch.zeros_like(value) if zeroed else value.clone()
    deeper.load_state_dict(state, strict=True)
    return deeper.eval()


def main(argv: list[str] | None = None) -> None:
    """Re-lay the drafter, point it at the new verifier's layers and save it."""
    args = parse_args(argv)
    drafter = SpecDrafterModel.from_pretrained(args.drafter, dtype=torch.float32)
    old_tokenizer = AutoTokenizer.from_pretrained(args.old_verifier)
    tokenizer = AutoTokenizer.from_pretrained(args.verifier)
    verifier_config = AutoConfig.from_pretrained(args.verifier)
    if verifier_config.d_model != (drafter.config.verifier_d_model or drafter.config.d_model):
        raise ValueError(f"--verifier has width {verifier_config.d_model}; the drafter reads states of another width")
    if old_tokenizer.pad_token_id != tokenizer.pad_token_id:
        old_ids = pad_last_permutation(len(old_tokenizer), old_tokenizer.pad_token_id)
        if relayout_tokenizer(old_tokenizer, old_ids).get_vocab() != tokenizer.get_vocab():
            raise ValueError(
                "--verifier's tokenizer is not --old_verifier's re-laid with <pad> last: the drafter cannot follow it"
            )
        relayout_spec_drafter(drafter, old_ids, tokenizer)
    elif old_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise ValueError("--verifier and --old_verifier have different vocabularies")
    layers = [int(layer) for layer in args.verifier_state_layers.split(",")]
    if len(layers) != len(drafter.config.verifier_state_layers or []):
        raise ValueError(
            f"--verifier_state_layers must name {len(drafter.config.verifier_state_layers or [])} layers, as many as "
            "the drafter reads (its projection's width)"
        )
    if not all(1 <= layer <= verifier_config.decoder_layers for layer in layers):
        raise ValueError(f"--verifier_state_layers must be in 1..{verifier_config.decoder_layers}, got {layers}")
    if args.decoder_layers is not None:
        drafter = deepen_decoder(drafter, args.decoder_layers)
    drafter.config.verifier_state_layers = layers
    drafter.config.verifier_name_or_path = args.verifier
    drafter.save_pretrained(args.output_dir)
    print(f"saved {args.output_dir}: re-laid for {args.verifier}, reading its decoder layers {layers}")


if __name__ == "__main__":
    main()
