"""The one training step (`specdec_hf.training.loss`): every split at once equals one split at a time."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import VOCAB_SIZE, build_verifier, make_source_batch

from specdec_hf import SpecDrafterModel, speculative_generate
from specdec_hf.training import (
    DrafterLossSettings,
    drafter_training_loss,
    every_split_labels,
    fit_drafter_in_memory,
    frequent_token_ids,
    token_counts,
    verifier_teacher_outputs,
)


def _batch(verifier, batch_size=4, max_new_tokens=9):
    source = make_source_batch(batch_size, pad_token_id=verifier.config.pad_token_id)
    targets = verifier.generate(**source, do_sample=False, max_new_tokens=max_new_tokens)
    lengths = torch.tensor([max_new_tokens + 1, max_new_tokens, max_new_tokens - 3, 3][:batch_size])
    return {**source, "target_ids": targets, "target_lengths": lengths}


@pytest.mark.parametrize(
    "overrides",
    [
        dict(use_verifier_encoder=True),
        dict(use_verifier_encoder=True, verifier_state_layers=[1, -1]),
        dict(encoder_layers=1, verifier_state_layers=[-1]),
    ],
    ids=["verifier_encoder", "features", "own_encoder_features"],
)
@pytest.mark.parametrize("soft_label_weight", [0.0, 0.5])
@pytest.mark.parametrize("reduced_head", [False, True])
def test_every_split_loss_equals_one_split_losses_summed(overrides, soft_label_weight, reduced_head):
    verifier = build_verifier("bart")
    batch = _batch(verifier)
    # a head over some of the targets' tokens: the others must be ignored
    kept = frequent_token_ids(token_counts(batch["target_ids"].tolist(), VOCAB_SIZE), 2) if reduced_head else None
    drafter = SpecDrafterModel.from_verifier(
        verifier, max_draft_tokens=3, draft_vocab_ids=kept, decoder_layers=1, prefix_attention="causal", **overrides
    ).eval()
    settings = DrafterLossSettings(split_points="all", label_smoothing=0.1, soft_label_weight=soft_label_weight)
    loss, count = drafter_training_loss(drafter, verifier, batch, settings)

    # the same objective, one forward per split point
    teacher = verifier_teacher_outputs(verifier, drafter, batch, soft_labels=True)
    splits = torch.arange(1, int(batch["target_lengths"].max()))
    labels = every_split_labels(batch["target_ids"], batch["target_lengths"], splits, 3)
    cross_entropy = kl = 0.0
    total = 0
    for index, length in enumerate(splits.tolist()):
        split_labels = labels[:, index]
        logits = drafter(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            encoder_hidden_states=teacher.encoder_states,
            decoder_input_ids=batch["target_ids"][:, :length],
            verifier_states=None if teacher.decoder_states is None else teacher.decoder_states[:, :length],
            labels=split_labels,
        ).logits
        head_labels = drafter.to_draft_vocab(split_labels)
        cross_entropy += F.cross_entropy(
            logits.flatten(0, 1), head_labels.flatten(), ignore_index=-100, label_smoothing=0.1, reduction="sum"
        )
        total += int((head_labels != -100).sum())
        teacher_log_probs = teacher.log_probs[:, length - 1 : length + 2]
        teacher_log_probs = F.pad(teacher_log_probs, (0, 0, 0, 3 - teacher_log_probs.shape[1]))
        per_slot = F.kl_div(logits.log_softmax(-1), teacher_log_probs, log_target=True, reduction="none").sum(-1)
        kl += (per_slot * (split_labels != -100)).sum()
    assert 0 < total < int((labels != -100).sum()) if reduced_head else total == int((labels != -100).sum())
    expected = cross_entropy / total + soft_label_weight * kl / int((labels != -100).sum())
    assert count == int((labels != -100).sum())
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)


def test_random_split_loss_uses_the_verifier_only_when_needed():
    verifier = build_verifier("bart")
    batch = _batch(verifier)
    drafter = SpecDrafterModel.from_verifier(verifier, max_draft_tokens=3, decoder_layers=1, encoder_layers=1)
    teacher = verifier_teacher_outputs(verifier, drafter, batch, soft_labels=False)
    assert teacher.encoder_states is None and teacher.log_probs is None and teacher.decoder_states is None
    generator = torch.Generator().manual_seed(0)
    loss, count = drafter_training_loss(drafter, None, batch, DrafterLossSettings(glancing_ratio=0.5), generator)
    assert torch.isfinite(loss) and count > 0


def test_in_memory_trainer_trains_a_verifier_encoder_drafter():
    """The shipped design (no encoder of its own, the verifier's encoder output) trains in memory too."""
    verifier = build_verifier("bart")
    source = make_source_batch(64, seed=3, pad_token_id=1)
    source["attention_mask"][:] = 1  # equal lengths keep the tiny task learnable in a few steps
    targets = verifier.generate(**source, do_sample=False, max_new_tokens=12)
    lengths = torch.full((64,), targets.shape[1])
    drafter = SpecDrafterModel.from_verifier(
        verifier,
        max_draft_tokens=4,
        decoder_layers=1,
        prefix_attention="causal",
        use_verifier_encoder=True,
        dropout=0.0,
    )
    with pytest.raises(ValueError, match="verifier="):
        fit_drafter_in_memory(drafter, source["input_ids"], source["attention_mask"], targets, lengths, steps=1)
    settings = DrafterLossSettings(split_points="all", label_smoothing=0.0)
    fit_drafter_in_memory(
        drafter,
        source["input_ids"],
        source["attention_mask"],
        targets,
        lengths,
        steps=150,
        verifier=verifier,
        settings=settings,
    )
    output = verifier.generate(
        input_ids=source["input_ids"][:16],
        attention_mask=source["attention_mask"][:16],
        do_sample=False,
        max_new_tokens=12,
        custom_generate=speculative_generate,
        drafter=drafter,
        return_dict_in_generate=True,
    )
    assert torch.equal(output.sequences, targets[:16])
    assert output.speculative_stats.tokens_per_iteration > 1.5


def test_teacher_pass_runs_under_the_runs_mixed_precision_and_returns_float32():
    verifier = build_verifier("bart")
    batch = _batch(verifier)
    drafter = SpecDrafterModel.from_verifier(
        verifier,
        max_draft_tokens=3,
        decoder_layers=1,
        use_verifier_encoder=True,
        prefix_attention="causal",
        verifier_state_layers=[1, -1],
    )
    computed_in = []
    for module in (verifier.get_encoder().layers[0].fc1, verifier.lm_head):
        module.register_forward_hook(lambda module, args, output: computed_in.append(output.dtype))

    def bfloat16_autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16)

    mixed = verifier_teacher_outputs(verifier, drafter, batch, soft_labels=True, autocast=bfloat16_autocast)
    full = verifier_teacher_outputs(verifier, drafter, batch, soft_labels=True)
    assert computed_in == [torch.bfloat16, torch.bfloat16, torch.float32, torch.float32]
    for name in ("encoder_states", "log_probs", "decoder_states"):
        assert getattr(mixed, name).dtype == torch.float32, name
        torch.testing.assert_close(getattr(mixed, name), getattr(full, name), atol=0.1, rtol=0.05)
    settings = DrafterLossSettings(soft_label_weight=0.5)
    with bfloat16_autocast():
        loss, _ = drafter_training_loss(drafter, verifier, batch, settings, autocast=bfloat16_autocast)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
