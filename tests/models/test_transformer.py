"""The Transformer decoder: teacher forcing equals incremental decoding, the decoding contract, training,
self-critical steps, checkpoints, the attention view in figures and grounding."""

from __future__ import annotations

import math
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from messages import raises_naming
from search_options import settings
from test_training import (  # noqa: F401
    as_flags,
    data_root,
    one_and_two_process_runs,
    read_steps,
    run_train,
    tiny_overrides,
    train_in_process,
)
from tool_runs import in_process

from captioning.config import ConfigError, DecodeConfig, LSTMDecoderConfig, TransformerDecoderConfig, to_dict
from captioning.config.loading import from_dict, load_config
from captioning.data.images import load_image
from captioning.data.vocab import Vocabulary
from captioning.evaluation.grounding import WordMatcher, grounding_scores
from captioning.evaluation.runner import default_instances, load_boxes
from captioning.hub.checkpoint import load_checkpoint
from captioning.inference.captioner import caption_records, load_captioner, split_records
from captioning.models.base import AttentionView
from captioning.models.decoding import beam_search, greedy_search, rollout, sampler
from captioning.models.transformer import TransformerDecoder
from captioning.training.engine import scst_loss
from captioning.training.optim import noam_factor

REPO = Path(__file__).resolve().parents[2]
V, C, GRID = 13, 6, (2, 3)
TRANSFORMER = {
    "model.decoder.kind": "transformer",
    "model.decoder.d_model": 16,
    "model.decoder.num_heads": 2,
    "model.decoder.d_ff": 32,
    "model.decoder.encoder_layers": 1,
    "model.decoder.decoder_layers": 2,
    "model.decoder.dropout": 0.1,
    "train.lr": 3e-3,
    "train.schedule": "noam",
    "train.warmup_steps": 4,
}


def make_decoder(pre_norm: bool = False, encoder_layers: int = 2, seed: int = 0) -> TransformerDecoder:
    torch.manual_seed(seed)
    return TransformerDecoder(
        V,
        C,
        GRID,
        d_model=16,
        num_heads=4,
        d_ff=32,
        encoder_layers=encoder_layers,
        decoder_layers=2,
        dropout=0.1,
        pre_norm=pre_norm,
    ).eval()


CAPTIONS = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 2, 0, 0], [1, 9, 10, 2, 0], [1, 4, 4, 2, 0]])
LENGTHS = torch.tensor([5, 3, 4, 4])


@pytest.mark.parametrize("pre_norm,encoder_layers", [(False, 2), (True, 1), (False, 0)])
@pytest.mark.parametrize("view", [AttentionView(), AttentionView(0, 1), AttentionView(None, None)])
def test_teacher_forced_forward_equals_step_by_step_decoding(pre_norm, encoder_layers, view):
    decoder = make_decoder(pre_norm, encoder_layers)
    decoder.set_attention_view(view)
    annotations = torch.randn(2, 6, C)
    image_index = torch.tensor([0, 1, 1, 0])  # several captions per image, one copy of its memory
    with torch.no_grad():
        output = decoder(annotations, CAPTIONS, LENGTHS, image_index)
        prepared = decoder.prepare(annotations).select(image_index)
        state = decoder.init_state(annotations).select(image_index)
        for t in range(output.logits.size(1)):
            step = decoder.step(prepared, CAPTIONS[:, t], state)
            state = step.state
            real = output.mask[:, t]
            torch.testing.assert_close(
                step.log_probs[real], torch.log_softmax(output.logits[real, t], -1), rtol=0, atol=1e-5
            )
            torch.testing.assert_close(step.alpha[real], output.alphas[real, t], rtol=0, atol=1e-5)
    assert torch.allclose(output.alphas.sum(-1)[output.mask], torch.ones(int(output.mask.sum())))
    assert not output.alphas[~output.mask].any()  # zero after each caption's end


def test_cached_steps_equal_recomputing_the_prefix_after_reordering():
    decoder = make_decoder()
    annotations = torch.randn(4, 6, C)
    prepared, state = decoder.prepare(annotations), decoder.init_state(annotations)
    tokens = torch.full((4,), Vocabulary.start_id)
    prefix = tokens.unsqueeze(1)
    order = torch.tensor([2, 0, 3, 1])
    with torch.no_grad():
        for t in range(5):
            step = decoder.step(prepared, tokens, state)
            recomputed = decoder(annotations, prefix, torch.full((4,), t + 2))  # the whole prefix again
            torch.testing.assert_close(
                step.log_probs, torch.log_softmax(recomputed.logits[:, -1], -1), rtol=0, atol=1e-5
            )
            tokens = step.log_probs[:, 4:].argmax(1) + 4
            # Reorder the rows as beam search does: the caches must follow their hypotheses.
            state, prepared, annotations = (
                step.state.select(order),
                prepared.select(order),
                annotations[order],
            )
            tokens, prefix = tokens[order], torch.cat([prefix, tokens.unsqueeze(1)], 1)[order]
            assert state.length == t + 1


@pytest.mark.slow
def test_beam_one_equals_greedy_and_batched_beam_equals_per_image():
    decoder = make_decoder(seed=3)
    annotations = torch.randn(5, 6, C)
    greedy = greedy_search(decoder, annotations, settings(max_length=8))
    beam_one = beam_search(decoder, annotations, settings(beam_size=1, max_length=8))
    assert [c.tokens for c in greedy] == [c.tokens for c in beam_one]
    for ours, theirs in zip(greedy, beam_one, strict=True):
        assert math.isclose(ours.log_prob, theirs.log_prob, abs_tol=1e-5)
        torch.testing.assert_close(ours.attention, theirs.attention, rtol=0, atol=1e-6)
    plain = settings(beam_size=3, max_length=8, length_alpha=0.7)
    diverse = settings(
        beam_size=4, beam_groups=2, diversity=1.0, repetition_penalty=1.3, num_return=4, max_length=8
    )
    for options in (plain, diverse):  # the caches move with their beams, whatever the search
        batched = beam_search(decoder, annotations, options)
        for i in range(annotations.size(0)):
            single = beam_search(decoder, annotations[i : i + 1], options)[0]
            # (fewer when two groups hold the same caption: a set of distinct ones is returned)
            assert len(batched[i].alternatives) == len(single.alternatives) <= options.num_return - 1
            for a, b in zip(
                [batched[i], *batched[i].alternatives], [single, *single.alternatives], strict=True
            ):
                assert a.tokens == b.tokens
                assert math.isclose(a.score, b.score, abs_tol=1e-5)
                torch.testing.assert_close(a.attention, b.attention, rtol=0, atol=1e-5)


def test_the_grid_is_encoded_once_per_image_for_all_its_beams_and_samples():
    decoder = make_decoder()
    rows = []
    decoder.grid_projection.register_forward_hook(
        lambda module, inputs, output: rows.append(inputs[0].size(0))
    )
    annotations = torch.randn(3, 6, C)
    beam_search(decoder, annotations, settings(beam_size=4, max_length=6))
    with torch.no_grad():
        result = rollout(decoder, annotations, sampler(), settings(max_length=6), repeats=5)
    assert rows == [3, 3]
    assert result.tokens.size(0) == 15


def test_self_critical_step_trains_the_transformer():
    decoder = make_decoder().train()
    rewards_seen = []

    def rewarder(ids, token_ids, finished):  # any reward that differs between captions
        rewards = np.array([float(sum(row)) / 100 for row in token_ids])
        rewards_seen.append(rewards)
        return rewards

    class Model:
        def __init__(self, decoder):
            self.decoder = decoder

    batch = {"features": torch.randn(2, 6, C), "image_ids": torch.tensor([1, 2])}
    config = load_config(None, {"train.scst_samples": 3}).train
    loss, numbers = scst_loss(Model(decoder), batch, rewarder, config, DecodeConfig(max_length=5))
    before = {k: v.clone() for k, v in decoder.state_dict().items()}
    torch.optim.Adam(decoder.parameters(), lr=1e-2).zero_grad()
    loss.backward()
    grads = [p.grad for p in decoder.parameters() if p.grad is not None]
    assert torch.isfinite(loss) and grads and all(torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
    torch.optim.SGD(decoder.parameters(), lr=1.0).step()
    assert any(not torch.equal(before[k], v) for k, v in decoder.state_dict().items())
    # One reward call per step: 2 images x 3 samples, then the 2 greedy baselines.
    assert decoder.training and [len(r) for r in rewards_seen] == [2 * 3 + 2]
    assert set(numbers) == {"reward", "baseline"}


def test_noam_warms_up_linearly_then_decays_as_inverse_square_root():
    assert [noam_factor(step, 4) for step in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert math.isclose(noam_factor(15, 4), math.sqrt(4 / 16))
    peak = max(range(100), key=lambda step: noam_factor(step, 10))
    assert peak == 9


def test_config_validation_and_old_checkpoints_load_as_lstm():
    with raises_naming(ConfigError, "model.decoder.d_model (30)", "model.decoder.num_heads (8)"):
        TransformerDecoderConfig(d_model=30, num_heads=8)
    with pytest.raises(ConfigError, match="model.decoder.kind"):
        LSTMDecoderConfig(kind="gru")
    with pytest.raises(ConfigError, match="train.warmup_steps"):
        load_config(None, {"train.warmup_steps": 0})
    stored = to_dict(load_config(None))
    del stored["model"]["decoder"]["kind"]  # a configuration saved before the key existed
    assert from_dict(stored).model.decoder.kind == "lstm"
    result = train_in_process(
        ["--set", "model.decoder.kind=transformer", "--set", "model.decoder.d_model=30"]
    )
    # The default file's LSTM options are left out without a word (the user named no file): one line.
    (error,) = result.stderr.splitlines()
    assert result.returncode == 2 and error.startswith("error: ") and "d_model" in error


@pytest.fixture(scope="module")
def trained(data_root, tmp_path_factory) -> Path:  # noqa: F811
    """A tiny Transformer trained with train.py on the Shapes features the LSTM tests cached."""
    output = tmp_path_factory.mktemp("transformer") / "run"
    result = train_in_process(
        as_flags(tiny_overrides(data_root, output, **TRANSFORMER, **{"train.epochs": 3}))
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return output


def test_shapes_transformer_config_reuses_the_lstm_demos_feature_cache():
    lstm, transformer = (
        load_config(REPO / "configs" / "shapes.yaml"),
        load_config(REPO / "configs" / "shapes_transformer.yaml"),
    )
    assert transformer.model.decoder.kind == "transformer" and transformer.train.schedule == "noam"
    assert transformer.model.encoder == lstm.model.encoder and transformer.data == lstm.data  # same cache key
    assert transformer.train.output_dir != lstm.train.output_dir
    coco = load_config(REPO / "configs" / "coco_transformer.yaml")
    assert (
        coco.model.decoder.kind == "transformer"
        and coco.model.decoder.d_model % coco.model.decoder.num_heads == 0
    )


@pytest.mark.slow
def test_train_py_lowers_the_loss_with_the_noam_schedule(trained):
    losses = [step["loss"] for step in read_steps(trained)]
    assert len(losses) == 24
    assert np.mean(losses[-4:]) < np.mean(losses[:4]) - 0.5, losses
    checkpoint = load_checkpoint(trained / "checkpoints" / "last.pt")
    lr = checkpoint["training"]["optimizer"]["param_groups"][0]["lr"]
    assert math.isclose(lr, 3e-3 * noam_factor(24, 4))  # stepped once per batch, ready for step 25


@pytest.mark.slow
def test_checkpoint_round_trip_rebuilds_the_transformer(trained):
    path = trained / "checkpoints" / "best.pt"
    payload = load_checkpoint(path)
    model, config = load_captioner(path, torch.device("cpu"))
    assert isinstance(model.decoder, TransformerDecoder) and config.model.decoder.kind == "transformer"
    assert len(model.decoder.blocks) == 2 and model.decoder.out.weight is model.decoder.embedding.weight
    for key, value in model.decoder.state_dict().items():
        assert torch.equal(value, payload["decoder"][key]), key
    records = split_records(config, "val")[:4]
    first = caption_records(model, config, records, torch.device("cpu"), progress=False)
    again = caption_records(
        load_captioner(path, torch.device("cpu"))[0], config, records, torch.device("cpu"), progress=False
    )
    assert [c.words for c in first] == [c.words for c in again]


@pytest.mark.slow
def test_grounding_scores_the_transformer_cross_attention(trained):
    """The maps grounding scores are the decoder's cross-attention: those of teacher-forcing the same
    captions."""
    path = trained / "checkpoints" / "best.pt"
    model, config = load_captioner(path, torch.device("cpu"))
    # Straight from the images, as the recomputation below: the same grids for both.
    config = replace(
        config, data=replace(config.data, use_cache=False), decode=replace(config.decode, strategy="greedy")
    )
    records = split_records(config, "val")[:6]
    captioned = [
        item
        for item in caption_records(model, config, records, torch.device("cpu"), progress=False)
        if item.words
    ]
    assert captioned
    images = torch.stack([model.encoder.transform(load_image(item.record.path)) for item in captioned])
    with torch.no_grad():
        grids = model.encode(images)
        for item, grid in zip(captioned, grids, strict=True):
            tokens = [Vocabulary.start_id, *item.caption.tokens, Vocabulary.end_id]
            output = model(grid[None], torch.tensor([tokens]), torch.tensor([len(tokens)]))
            torch.testing.assert_close(
                item.caption.attention, output.alphas[0, : len(item.words)], rtol=0, atol=1e-4
            )
    instances = load_boxes(default_instances(config))
    items = [
        (item.record.image_id, item.words, item.caption.attention.numpy(), model.grid) for item in captioned
    ]
    scores = grounding_scores(items, instances, WordMatcher())
    assert set(scores) >= {"grounding-mass", "grounding-pointing", "grounding-words"}


@pytest.mark.slow
def test_visualize_draws_the_chosen_layer_and_head(trained, tmp_path):
    checkpoint = trained / "checkpoints" / "best.pt"

    def visualize(*options: str) -> subprocess.CompletedProcess:
        return in_process(
            "visualize.py",
            "--checkpoint",
            checkpoint,
            "--split",
            "val",
            "--num",
            "2",
            "--no-progress",
            *options,
            cwd=REPO,
        )

    from captioning.cli.visualize import visualize_images

    last = visualize_images(checkpoint, split="val", num=2, out_dir=tmp_path / "last", progress=False)
    first = visualize_images(
        checkpoint,
        split="val",
        num=2,
        out_dir=tmp_path / "first",
        layer=1,
        head=2,
        html=tmp_path / "first.html",
        progress=False,
    )
    assert [c.words for c in last.captioned] == [c.words for c in first.captioned]
    differs = [
        not torch.allclose(a.caption.attention, b.caption.attention)
        for a, b in zip(last.captioned, first.captioned, strict=True)
        if a.words
    ]
    assert differs and all(differs)  # another layer's and head's map, for the same words
    assert "layer 1 of 2, head 2 of 2" in (tmp_path / "first.html").read_text()
    result = visualize("--layer", "mean", "--head", "mean", "--out-dir", str(tmp_path / "mean"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(list((tmp_path / "mean").glob("*.png"))) == 2
    for options, words in (
        (("--layer", "3"), "layer 3"),
        (("--head", "0"), "--head"),
        (("--layer", "x"), "--layer"),
    ):
        result = visualize(*options, "--out-dir", str(tmp_path / "bad"))
        assert result.returncode == 2 and result.stderr.count("\n") == 1 and words in result.stderr, (
            result.stderr
        )
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_resume_mid_epoch_continues_the_noam_schedule_exactly(trained, data_root, tmp_path):  # noqa: F811
    """Stopped at step 10 (mid-epoch, after the warm-up) and resumed: the same 24 losses and weights."""
    flags = as_flags(tiny_overrides(data_root, tmp_path / "run", **TRANSFORMER, **{"train.epochs": 3}))
    result = train_in_process([*flags, "--set", "train.max_steps=10"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["training"]["state"]["global_step"]
        == 10
    )
    result = run_train([*flags, "--resume"])  # a new process: nothing carries over in memory
    assert result.returncode == 0, result.stderr[-3000:]
    expected, resumed = read_steps(trained), read_steps(tmp_path / "run")
    assert [s["step"] for s in resumed] == [s["step"] for s in expected] == list(range(1, 25))
    np.testing.assert_allclose([s["loss"] for s in resumed], [s["loss"] for s in expected], rtol=1e-6)
    final_a = load_checkpoint(trained / "checkpoints" / "last.pt")["decoder"]
    final_b = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["decoder"]
    for key in final_a:
        torch.testing.assert_close(final_a[key], final_b[key], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_two_process_transformer_training_matches_one_process(data_root, tmp_path):  # noqa: F811
    one, two = one_and_two_process_runs(
        data_root,
        tmp_path,
        {**TRANSFORMER, "train.max_steps": 3, "model.decoder.dropout": 0.0, "train.batch_size": 8},
    )
    assert one["training"]["state"]["global_step"] == two["training"]["state"]["global_step"] == 3
    assert (
        one["training"]["optimizer"]["param_groups"][0]["lr"]
        == two["training"]["optimizer"]["param_groups"][0]["lr"]
    )
    # Adam turns rounding differences of near-zero gradients (feature channels that are almost always
    # 0) into updates of up to ~1e-5; a wrong gradient average would move weights by ~lr = 1e-3.
    for key, value in one["decoder"].items():
        torch.testing.assert_close(
            two["decoder"][key], value, rtol=1e-4, atol=5e-5, msg=lambda m, key=key: f"{key}: {m}"
        )
