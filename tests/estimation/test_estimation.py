"""The speed-up estimator: acceptance profiles, the oracle drafter, the projection arithmetic, the CLI and its errors."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import GPT2Config, MarianConfig

from specdec_hf.estimation import (
    BUILTIN_SHAPES,
    AcceptanceProfile,
    IterationCost,
    MeasurementSettings,
    estimate_shape,
    load_verifier_config,
    predicted_speedup,
    recommended_drafter,
)
from specdec_hf.estimation.__main__ import main as estimate_main
from specdec_hf.estimation.measurement import build_shape_models, measure_greedy_reference, speculative_run

TINY = MarianConfig(
    vocab_size=99,
    d_model=32,
    encoder_layers=2,
    decoder_layers=3,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
    init_std=0.2,  # no near-ties: the oracle's output must equal greedy token for token
    pad_token_id=98,
    eos_token_id=0,
    decoder_start_token_id=98,
)
SETTINGS = MeasurementSettings(sentences=2, source_length=8, max_new_tokens=12, rounds=1, calibration_rounds=1)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_verifier")
    TINY.save_pretrained(path)
    (path / "generation_config.json").write_text(json.dumps({"bad_words_ids": [[98]]}))
    return path


@pytest.fixture(scope="module")
def tiny_models(tiny_dir):
    models = build_shape_models("tiny", load_verifier_config(str(tiny_dir)), SETTINGS, max_draft_tokens=4)
    measure_greedy_reference(models, SETTINGS)
    return models


# --- acceptance profiles -------------------------------------------------------------------------------------------
def test_profile_tokens_per_iteration_is_one_plus_the_survival_sum():
    profile = AcceptanceProfile((0.5, 0.4))
    assert profile.survival(3) == pytest.approx([0.5, 0.2, 0.08])  # the last rate repeats
    assert profile.tokens_per_iteration(3) == pytest.approx(1.78)
    assert AcceptanceProfile.perfect().tokens_per_iteration(4) == 5.0


def test_constant_profile_reaches_the_requested_tokens_per_iteration():
    profile = AcceptanceProfile.constant_for_tokens(2.5, 4)
    assert profile.tokens_per_iteration(4) == pytest.approx(2.5, abs=1e-6)


def test_draws_are_reproducible_and_follow_the_profile():
    profile = AcceptanceProfile((0.8, 0.5))
    draws = profile.draw_accepted((4, 5000), num_draft_tokens=3, seed=7)
    assert torch.equal(draws, profile.draw_accepted((4, 5000), num_draft_tokens=3, seed=7))
    assert int(draws.min()) >= 0 and int(draws.max()) <= 3
    # P(a >= 1) = 0.8, P(a >= 2) = 0.4, P(a >= 3) = 0.2
    for at_least, expected in ((1, 0.8), (2, 0.4), (3, 0.2)):
        assert float((draws >= at_least).float().mean()) == pytest.approx(expected, abs=0.02)


@pytest.mark.parametrize("rates", [(), (1.2,), (0.5, -0.1), ("high",)])
def test_impossible_profiles_are_refused(rates):
    with pytest.raises(ValueError, match="acceptance|rate"):
        AcceptanceProfile(rates)


def test_impossible_tokens_per_iteration_is_refused():
    with pytest.raises(ValueError, match=r"impossible at k=4.*between 1 and k \+ 1 = 5"):
        AcceptanceProfile.constant_for_tokens(5.5, 4)


def test_profile_from_speculative_counters_and_results_json(tmp_path):
    stats = {"accepted_at_position": [80, 40, 10], "verified_at_position": [100, 80, 40]}
    profile = AcceptanceProfile.from_counts(stats["accepted_at_position"], stats["verified_at_position"], "run")
    assert profile.rates == pytest.approx((0.8, 0.5, 0.25))
    (tmp_path / "stats.json").write_text(json.dumps(stats))
    assert AcceptanceProfile.from_file(tmp_path / "stats.json").rates == profile.rates
    results = {"strategies": {"greedy": {"speculative": None}, "spec_k3_b1_t0": {"speculative": stats}}}
    (tmp_path / "results.json").write_text(json.dumps(results))
    assert AcceptanceProfile.from_file(tmp_path / "results.json").rates == profile.rates
    with pytest.raises(ValueError, match="no speculative strategy 'spec_k9'"):
        AcceptanceProfile.from_file(tmp_path / "results.json", strategy="spec_k9")
    earlier = {
        "strategies": {"spec_k3_b1_t0": {"speculative": {"accepted_at_position": [1], "drafted_at_position": [2]}}}
    }
    (tmp_path / "earlier.json").write_text(json.dumps(earlier))
    with pytest.raises(ValueError, match="earlier.json: written by an earlier version.*run evaluate.py again"):
        AcceptanceProfile.from_file(tmp_path / "earlier.json")
    (tmp_path / "other.json").write_text(json.dumps({"bleu": 3}))
    with pytest.raises(ValueError, match="other.json.*found none"):
        AcceptanceProfile.from_file(tmp_path / "other.json")


# --- shapes ----------------------------------------------------------------------------------------------------------
def test_builtin_shapes_are_encoder_decoder_configs_with_their_published_sizes():
    assert set(BUILTIN_SHAPES) == {"opus-mt-en-de", "t5-small", "t5-base", "bart-base", "bart-large", "pegasus-large"}
    opus = load_verifier_config("opus-mt-en-de")
    assert (opus.model_type, opus.d_model, opus.decoder_layers, opus.vocab_size, opus.pad_token_id) == (
        "marian",
        512,
        6,
        58101,
        58100,
    )
    assert opus.generation_overrides == {"bad_words_ids": [[58100]]}
    assert load_verifier_config("pegasus-large").decoder_layers == 16


def test_unknown_shape_and_wrong_configs_get_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="'bart-huge' is not a built-in shape"):
        load_verifier_config("bart-huge")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="has no config.json"):
        load_verifier_config(str(tmp_path / "empty"))
    GPT2Config(n_layer=1, n_embd=16, n_head=2).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ValueError, match="'gpt2' is not an encoder-decoder model"):
        load_verifier_config(str(tmp_path / "gpt2"))


# --- the oracle drafter ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rates, expected_tok", [((1.0,), 5.0), ((0.0,), 1.0)])
def test_oracle_output_equals_greedy_and_its_acceptance_follows_the_profile(tiny_models, rates, expected_tok):
    output = speculative_run(tiny_models, 0, AcceptanceProfile(rates), 4, SETTINGS)
    assert torch.equal(output.sequences.cpu(), tiny_models.references[0])
    stats = output.speculative_stats
    if expected_tok == 1.0:
        assert stats.accepted_tokens == [0] and stats.iterations == [SETTINGS.max_new_tokens]
    else:  # 12 tokens in blocks of 5: 5 + 5 + 2 (the last block cut by the length limit)
        assert stats.iterations == [3] and stats.accepted_tokens == [4 + 4 + 1]


def test_oracle_accepts_exactly_the_drawn_counts(tiny_models):
    profile = AcceptanceProfile((0.7, 0.5))
    output = speculative_run(tiny_models, 1, profile, 4, SETTINGS)
    assert torch.equal(output.sequences.cpu(), tiny_models.references[1])
    draws = profile.draw_accepted((1, tiny_models.references[1].shape[1]), 4, SETTINGS.seed + 1)[0]
    remaining, expected_accepted = SETTINGS.max_new_tokens, 0
    for accepted in draws.tolist():  # replay the loop: each iteration emits min(a + 1, what is left)
        if remaining == 0:
            break
        emitted = min(accepted + 1, remaining)
        expected_accepted += emitted - 1
        remaining -= emitted
    assert output.speculative_stats.accepted_tokens == [expected_accepted]


def test_profile_read_from_a_real_run_of_perfect_drafts_is_perfect(tiny_models):
    """The length budget cuts the last iteration short; that must not read as rejections."""
    stats = speculative_run(tiny_models, 0, AcceptanceProfile.perfect(), 4, SETTINGS).speculative_stats
    assert stats.verified_at_position != [stats.verified_at_position[0]] * 4  # the budget did cut an iteration
    profile = AcceptanceProfile.from_counts(stats.accepted_at_position, stats.verified_at_position, "run")
    assert profile.rates == (1.0, 1.0, 1.0, 1.0)


def test_recommended_drafter_reads_three_verifier_layers_and_refuses_k_beyond_it(tiny_models):
    drafter = tiny_models.drafter
    assert drafter.config.verifier_state_layers == [1, 2, 3]
    assert drafter.config.use_verifier_encoder and drafter.config.decoder_layers == 1
    with pytest.raises(ValueError, match="k=8 is beyond the drafter.*max_draft_tokens=4"):
        recommended_drafter(tiny_models.verifier, 8, {"max_draft_tokens": 4})


# --- projection and the whole estimate -------------------------------------------------------------------------------
def test_predicted_speedup_arithmetic():
    cost = IterationCost(
        num_draft_tokens=4, verify_s=0.010, drafter_s=0.004, loop_s=0.002, fixed_s=0.05, tokens_per_iteration=3
    )
    # greedy 1.0 s for 2 sentences of 48 tokens; speculative 2 * 0.05 + 96 / 3 * 0.016 = 0.612 s
    assert predicted_speedup(1.0, cost, 2, 96, 3.0) == pytest.approx(1.0 / 0.612)
    with pytest.raises(ValueError, match="outside"):
        predicted_speedup(1.0, cost, 2, 96, 6.0)


def test_estimate_shape_returns_costs_grid_and_validation(tiny_dir):
    result = estimate_shape(
        str(tiny_dir), AcceptanceProfile((0.8, 0.6)), [2, 4], [2.0, 3.0], SETTINGS, log=lambda line: None
    )
    assert set(result["costs"]) == {2, 4} and result["best_k"] in (2, 4)
    assert set(result["linear_kernels"]) == {"verifier", "drafter"}  # prepacked where measured faster, recorded
    assert set(result["grid"][2]) == {"2.0", "3.0"} and set(result["grid"][4]) == {"2.0", "3.0", "5.0"}
    assert all(value > 0 for row in result["grid"].values() for value in row.values())
    # more accepted tokens per iteration at the same k can only help
    assert result["grid"][4]["3.0"] > result["grid"][4]["2.0"]
    for run in result["validation"].values():
        assert run["mismatches"] == 0 and run["measured_speedup"] > 0 and run["projected_speedup"] > 0
    assert result["calibration_mismatches"] == 0
    for row in result["costs"].values():  # every part of an iteration and the per-sentence cost measured, not negative
        assert all(value >= 0 for value in row["ms"].values()) and row["ms"]["fixed_per_sentence"] > 0
    tokens, speedups = zip(*result["curve_at_best_k"], strict=True)
    assert tokens[0] == 1.0 and tokens[-1] == result["best_k"] + 1 and list(speedups) == sorted(speedups)
    assert (
        result["validation"]["perfect"]["tokens_per_iteration"]
        > result["validation"]["profile"]["tokens_per_iteration"]
    )


def test_cli_writes_report_json_and_plot(tiny_dir, tmp_path, capsys):
    argv = [
        "--verifier",
        str(tiny_dir),
        "--num_draft_tokens",
        "2,3",
        "--tokens_per_iteration",
        "2",
        "--sentences",
        "1",
    ]
    argv += ["--max_new_tokens", "8", "--rounds", "1", "--calibration_rounds", "1", "--acceptance", "0.9,0.5"]
    argv += ["--output_dir", str(tmp_path), "--threads", "1"]
    results = estimate_main(argv)
    assert len(results) == 1
    report = (tmp_path / "report.md").read_text()
    assert "| k | verify | drafter | loop |" in report and "Tok. 2" in report
    assert json.loads((tmp_path / "results.json").read_text())["profile"] == [0.9, 0.5]
    assert (tmp_path / "speedup_by_tokens.png").stat().st_size > 1000
    assert "greedy ms/token" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--num_draft_tokens", "0,4"], "each k must be at least 1"),
        (["--num_draft_tokens", "four"], "comma-separated ints"),
        (["--tokens_per_iteration", "0.5"], "Tok. is at least 1"),
        (["--acceptance", "0.5", "--acceptance_from", "x.json"], "not both"),
        (["--dtype", "int4"], "--dtype must be one of"),
        (["--acceptance", "1.5"], r"probabilities in \[0, 1\]"),
    ],
)
def test_cli_bad_input(argv, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        estimate_main([*argv, "--verifier", "t5-small", "--output_dir", str(tmp_path)])
