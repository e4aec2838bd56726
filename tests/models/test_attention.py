"""Attention scorers: weights are distributions over the grid, and projections are made once per image."""

from __future__ import annotations

import pytest
import torch
from search_options import settings

from captioning.config import LSTMDecoderConfig
from captioning.models.attention import SCORERS, Prepared, ScaledDotAttention, build_attention
from captioning.models.decoder import ShowAttendTellDecoder
from captioning.models.decoding import beam_search, greedy_search, sample_captions
from captioning.registry import UnknownNameError

C, H, A, P, HEADS = 12, 16, 16, 9, 4  # annotation channels, hidden, attention size, positions, heads
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
    with pytest.raises(
        UnknownNameError, match="model.decoder.scoring names an unknown attention scorer 'cosine'"
    ):
        make_scorer("cosine")
    with pytest.raises(ValueError, match="not divisible"):
        ScaledDotAttention(C, H, 10, num_heads=4)


def test_multihead_context_concatenates_heads_before_projection():
    torch.manual_seed(2)
    attention = make_scorer("multihead")
    assert attention.num_heads == HEADS
    prepared = attention.prepare(torch.randn(2, P, C))
    assert prepared.keys.shape == (2, HEADS, P, A // HEADS)
    assert prepared.values.shape == (2, HEADS, P, A // HEADS)
    # One-hot weights on position 3 in every head: the context is the projected value at position 3.
    weights = torch.zeros(2, HEADS, P)
    weights[..., 3] = 1.0
    expected = attention.output_proj(prepared.values[:, :, 3].flatten(1))
    torch.testing.assert_close(attention.combine(weights, prepared), expected)


def test_prepared_select_and_head():
    keys = torch.arange(4 * P * 2, dtype=torch.float32).view(4, P, 2)
    values = -keys
    prepared = Prepared(keys, values)
    index = torch.tensor([2, 2, 0, 3, 1])
    selected = prepared.select(index)
    assert isinstance(selected, Prepared)
    assert torch.equal(selected.keys, keys[index]) and torch.equal(selected.values, values[index])
    head = prepared.head(2)
    assert isinstance(head, Prepared)
    assert torch.equal(head.keys, keys[:2]) and torch.equal(head.values, values[:2])
    # a view, not a copy: the shrinking active batch costs nothing
    assert head.keys.data_ptr() == keys.data_ptr() and head.values.data_ptr() == values.data_ptr()
    # multi-head layout (B, nh, P, dk) selects on the batch dimension too
    heads = Prepared(torch.randn(3, HEADS, P, 2), torch.randn(3, HEADS, P, 2))
    assert torch.equal(heads.select(torch.tensor([1, 0])).keys, heads.keys[[1, 0]])


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
    """Rows seen by every call of the module that projects the annotations (a forward hook)."""
    attention = decoder.attention
    module = getattr(attention, "annotation_proj", None) or getattr(attention, "key_value_proj", None)
    calls: list[int] = []
    if module is not None:
        module.register_forward_hook(lambda mod, inputs, output: calls.append(inputs[0].size(0)))
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
    if scoring != "dot":  # dot scoring has no annotation projection
        assert hooked == [2]


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
    if scoring != "dot":
        assert hooked == [3]


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
