"""Attention scorers: weights are distributions over the grid, and projections are made once per image."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from search_options import settings

from captioning.config import ConfigError, LSTMDecoderConfig, ModelConfig
from captioning.models.attention import SCORERS, ScaledDotAttention, build_attention
from captioning.models.captioner import check_model_config
from captioning.models.decoder import ShowAttendTellDecoder
from captioning.models.decoding import beam_search, greedy_search, sample_captions
from captioning.registry import UnknownNameError

# annotation channels, hidden, attention size, positions, heads; C = H so that every scorer builds (dot)
C, H, A, P, HEADS = 16, 16, 8, 9, 4
VOCAB = 10

# Every registered scorer (so a newly registered one is covered), and the additive one's ReLU variant.
SCORINGS = [(name, "tanh") for name in SCORERS.names()] + [("additive", "relu")]
SCORING_IDS = [f"{name}-{activation}" for name, activation in SCORINGS]


pytestmark = pytest.mark.usefixtures("single_thread")


def scorer_config(scoring: str, activation: str = "tanh", attention: str = "soft") -> LSTMDecoderConfig:
    return LSTMDecoderConfig(
        attention=attention,
        scoring=scoring,
        activation=activation,
        num_heads=HEADS,
        embed_dim=16,
        hidden_dim=H,
        attention_dim=A,
        dropout=0.0,
    )


def make_scorer(scoring: str, activation: str = "tanh"):
    return build_attention(scorer_config(scoring, activation), C)


def make_decoder(scoring: str, activation: str = "tanh", attention: str = "soft") -> ShowAttendTellDecoder:
    return ShowAttendTellDecoder.from_config(scorer_config(scoring, activation, attention), VOCAB, C).eval()


@pytest.mark.parametrize("scoring, activation", SCORINGS, ids=SCORING_IDS)
def test_weights_are_distributions_over_positions(scoring, activation):
    torch.manual_seed(0)
    attention = make_scorer(scoring, activation)
    heads = attention.num_heads
    annotations = torch.randn(3, P, C) * 3  # large inputs: scores far apart, softmax near one-hot
    query = torch.randn(3, H) * 3
    weights = attention(attention.prepare(annotations), query)
    assert weights.shape == (3, heads, P)
    assert (weights >= 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, heads))
    context = attention.combine(weights, attention.prepare(annotations))
    assert context.shape == (3, attention.context_dim)


@pytest.mark.parametrize("scoring, activation", SCORINGS, ids=SCORING_IDS)
def test_weights_depend_on_query_and_image(scoring, activation):
    torch.manual_seed(1)
    attention = make_scorer(scoring, activation)
    annotations = torch.randn(2, P, C)
    prepared = attention.prepare(annotations)
    query = torch.randn(2, H)
    weights = attention(prepared, query)
    assert not torch.allclose(weights, attention(prepared, torch.randn(2, H)))
    assert not torch.allclose(weights[0], weights[1])  # different images, different weights


def test_unknown_scoring_and_indivisible_heads_are_rejected():
    with pytest.raises(UnknownNameError) as unknown:
        make_scorer("luong_concat")
    assert "model.decoder.scoring" in str(unknown.value) and "'luong_concat'" in str(unknown.value)
    assert all(name in str(unknown.value) for name in SCORERS.names())  # the registered names, listed
    with pytest.raises(ValueError, match="not divisible"):
        ScaledDotAttention(C, H, 10, num_heads=4)
    # A scorer's own checks of the configuration's sizes run with the names', before any work.
    config = ModelConfig(decoder=replace(scorer_config("multihead"), attention_dim=10))
    with pytest.raises(ConfigError) as indivisible:
        check_model_config(config)
    assert "model.decoder.attention_dim" in str(indivisible.value) and "model.decoder.num_heads" in str(
        indivisible.value
    )


def test_the_dot_scorer_is_the_plain_dot_product_and_general_is_bilinear():
    torch.manual_seed(0)
    annotations, query = torch.randn(2, P, C), torch.randn(2, H)
    dot = make_scorer("dot")
    assert list(dot.parameters()) == []
    expected = torch.softmax(torch.einsum("bpc,bc->bp", annotations, query), dim=-1)
    torch.testing.assert_close(dot(dot.prepare(annotations), query)[:, 0], expected)
    general = make_scorer("general")
    (weight,) = general.parameters()  # W: (C, H)
    expected = torch.softmax(torch.einsum("bpc,bc->bp", annotations, query @ weight.T), dim=-1)
    torch.testing.assert_close(general(general.prepare(annotations), query)[:, 0], expected)
    cosine = make_scorer("cosine")
    projected = torch.nn.functional.normalize(query @ cosine.query_proj.weight.T, dim=-1)
    cosines = torch.einsum("bpc,bc->bp", torch.nn.functional.normalize(annotations, dim=-1), projected)
    torch.testing.assert_close(
        cosine(cosine.prepare(annotations), query)[:, 0], torch.softmax(10 * cosines, -1)
    )
    with pytest.raises(ConfigError) as sizes:
        build_attention(scorer_config("dot"), C + 1)
    assert "model.decoder.hidden_dim" in str(sizes.value) and "general" in str(sizes.value)


class PrepareCounter:
    """Wraps ``attention.prepare`` and records the batch size of every call."""

    def __init__(self, decoder: ShowAttendTellDecoder):
        self.batch_sizes: list[int] = []
        original = decoder.attention.prepare

        def counted(annotations):
            self.batch_sizes.append(annotations.size(0))
            return original(annotations)

        decoder.attention.prepare = counted


def projection_calls(decoder: ShowAttendTellDecoder) -> list[int]:
    """Images seen by every call of a submodule of the scorer on annotation vectors ((B, P, C), not
    the (N, P, A) of a step), whatever the scorer names its modules (a forward hook on each)."""
    calls: list[int] = []

    def record(module, inputs, output):
        x = inputs[0] if inputs else None
        if isinstance(x, torch.Tensor) and x.dim() == 3 and (x.size(1), x.size(2)) == (P, C):
            calls.append(inputs[0].size(0))

    for module in decoder.attention.modules():
        module.register_forward_hook(record)
    return calls


@pytest.mark.parametrize("attention", ["soft", "hard"])
@pytest.mark.parametrize("scoring, activation", SCORINGS, ids=SCORING_IDS)
def test_prepare_runs_once_per_image_in_teacher_forcing(scoring, activation, attention):
    torch.manual_seed(3)
    decoder = make_decoder(scoring, activation, attention).train()
    counter = PrepareCounter(decoder)
    hooked = projection_calls(decoder)
    annotations = torch.randn(2, P, C)
    captions = torch.randint(4, VOCAB, (5, 7))
    lengths = torch.tensor([7, 5, 3, 6, 2])
    decoder(annotations, captions, lengths, image_index=torch.tensor([0, 0, 1, 1, 1]))
    assert counter.batch_sizes == [2]  # once, for the 2 images, not per caption or per step
    assert set(hooked) <= {2}  # every module that reads the annotations reads them once per image


@pytest.mark.parametrize("scoring, activation", SCORINGS, ids=SCORING_IDS)
@pytest.mark.parametrize("strategy", ["greedy", "beam", "sample"])
def test_prepare_runs_once_per_image_in_decoding(scoring, activation, strategy):
    torch.manual_seed(4)
    decoder = make_decoder(scoring, activation)
    counter = PrepareCounter(decoder)
    hooked = projection_calls(decoder)
    annotations = torch.randn(3, P, C)
    if strategy == "greedy":
        greedy_search(decoder, annotations, settings(max_length=6))
    elif strategy == "beam":
        beam_search(decoder, annotations, settings(beam_size=4, max_length=6))
    else:
        sample_captions(decoder, annotations, settings(max_length=6))
    assert counter.batch_sizes == [3]  # before the beams are expanded, never once per step
    assert set(hooked) <= {3}


@pytest.mark.parametrize("heads", [1, 4])
def test_scaled_dot_keys_carry_no_bias_so_adam_has_no_rounding_noise_to_amplify(heads):
    # A key bias adds b_k . q to every cell's score and cancels in the softmax: its gradient would be
    # rounding noise, which Adam scales to full-size steps. It is left out: weights do not depend on
    # it, and its gradient is exactly zero (the values' half of the bias is used and learns).
    torch.manual_seed(0)
    attention = ScaledDotAttention(12, 10, 8, heads)
    annotations, query = torch.randn(3, 5, 12), torch.randn(3, 10)
    prepared = attention.prepare(annotations)
    weights = torch.softmax(attention.scores(prepared, query), dim=-1)
    context = attention.combine(weights, prepared)
    context.square().sum().backward()
    grad = attention.key_value_proj.bias.grad
    assert torch.equal(grad[:8], torch.zeros(8)) and grad[8:].abs().sum() > 0
    with torch.no_grad():
        attention.key_value_proj.bias[:8] += 3.0
    moved = torch.softmax(attention.scores(attention.prepare(annotations), query), dim=-1)
    torch.testing.assert_close(moved, weights, rtol=0, atol=0)


@pytest.mark.parametrize("group", [1, 3])
def test_the_context_is_made_in_the_grids_dtype_under_bf16_autocast(group):
    # Under CPU bf16 autocast the product would otherwise cast the whole (B, P, C) grid at every step.
    torch.manual_seed(0)
    attention = make_scorer("additive")
    prepared = attention.prepare(torch.rand(2, P, C))._replace(group=group)
    weights = torch.softmax(torch.rand(2 * group, 1, P), dim=-1)  # (N, 1, P)
    expected = attention.combine(weights, prepared)  # (N, C)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        context = attention.combine(weights.bfloat16(), prepared)
    assert context.dtype == torch.float32
    torch.testing.assert_close(context, expected, rtol=1e-2, atol=1e-3)  # only the weights were rounded
