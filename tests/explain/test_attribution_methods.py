"""Each attribution method on tiny decoders equals an independent computation: occlusion by an explicit
loop over the cells, gradient x input and Grad-CAM by autograd, integrated gradients against a Riemann
sum, rollout and the gradient-weighted rollout by hand over the joint graph of a 2-layer Transformer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from captioning.config import LSTMDecoderConfig, TransformerDecoderConfig
from captioning.explain import METHODS, ExplainInputs, ExplainSettings, explain
from captioning.explain.methods import parse_methods
from captioning.explain.scoring import WordScorer, caption_tensor
from captioning.explain.transformer import traced_forward
from captioning.models.base import AttentionView
from captioning.models.decoder import ShowAttendTellDecoder
from captioning.models.transformer import TransformerDecoder
from captioning.utils.errors import InputError

pytestmark = pytest.mark.usefixtures("single_thread")

V, C, GRID = 11, 5, (2, 3)
P = GRID[0] * GRID[1]
TOKENS = [[4, 7, 5], [6, 8, 9, 10, 4]]  # two captions of 3 and 5 words


def build(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "transformer":
        config = TransformerDecoderConfig(
            d_model=8, num_heads=2, d_ff=16, encoder_layers=1, decoder_layers=2, dropout=0.0
        )
        decoder = TransformerDecoder.from_config(config, V, C, GRID)
    else:
        config = LSTMDecoderConfig(
            embed_dim=8,
            hidden_dim=8,
            attention_dim=8,
            dropout=0.0,
            attention="hard" if kind == "hard" else "soft",
        )
        decoder = ShowAttendTellDecoder.from_config(config, V, C)
    return decoder.double().eval()


def inputs_of(decoder, steps: int = 16) -> ExplainInputs:
    torch.manual_seed(1)
    annotations = torch.rand(2, P, C, dtype=torch.float64)
    captions, lengths = caption_tensor(TOKENS, 1, 2)
    baseline = torch.rand(C, dtype=torch.float64)
    return ExplainInputs(
        WordScorer(decoder, captions, lengths), annotations, baseline, ExplainSettings(steps, 5)
    )


def word_log_probs(decoder, annotations: torch.Tensor) -> torch.Tensor:
    """(2, 5) log p of each caption word, straight from the decoder's teacher-forced logits."""
    captions, lengths = caption_tensor(TOKENS, 1, 2)
    logits = decoder(annotations, captions, lengths).logits
    log_probs = torch.log_softmax(logits, dim=-1)
    return torch.stack(
        [
            torch.stack(
                [
                    log_probs[b, t, captions[b, t + 1]] if t < len(TOKENS[b]) else logits.new_zeros(())
                    for t in range(5)
                ]
            )
            for b in range(2)
        ]
    )


def gradients(decoder, annotations: torch.Tensor) -> dict[tuple[int, int], torch.Tensor]:
    """(caption, word) -> the gradient (P, C) of the word's log-probability on its image's grid."""
    grid = annotations.clone().requires_grad_(True)
    scores = word_log_probs(decoder, grid)
    return {(b, t): torch.autograd.grad(scores[b, t], grid, retain_graph=True)[0][b] for b, t in real_words()}


def real_words():
    return [(b, t) for b in range(2) for t in range(len(TOKENS[b]))]


KINDS = ["soft", "hard", "transformer"]


@pytest.mark.parametrize("kind", KINDS)
def test_occlusion_equals_a_loop_over_cells(kind):
    decoder = build(kind)
    inputs = inputs_of(decoder)
    maps = explain("occlusion", inputs)
    full = word_log_probs(decoder, inputs.annotations).detach()
    for p in range(P):
        occluded = inputs.annotations.clone()
        occluded[:, p] = inputs.baseline
        drop = full - word_log_probs(decoder, occluded).detach()
        for b, t in real_words():
            assert maps[b, t, p].item() == pytest.approx(drop[b, t].item(), abs=1e-6)
    assert maps[0, 3:].abs().max() == 0  # after the first caption's end


@pytest.mark.parametrize("kind", KINDS)
def test_gradient_x_input_and_gradcam_equal_autograd(kind):
    decoder = build(kind)
    inputs = inputs_of(decoder)
    gradient, cam = explain("gradient", inputs), explain("gradcam", inputs)
    all_grads = gradients(decoder, inputs.annotations)
    for b, t in real_words():
        grads = all_grads[(b, t)]  # (P, C)
        expected = (grads * inputs.annotations[b]).sum(-1)
        torch.testing.assert_close(gradient[b, t], expected.float(), atol=1e-6, rtol=1e-5)
        weights = grads.mean(0)  # (C,) Grad-CAM's channel weights: gradients pooled over the cells
        expected_cam = (inputs.annotations[b] * weights).sum(-1).clamp_min(0)
        torch.testing.assert_close(cam[b, t], expected_cam.float(), atol=1e-6, rtol=1e-5)
    assert gradient.abs().sum() > 0 and cam.sum() > 0


@pytest.mark.parametrize("kind", KINDS)
def test_integrated_gradients_equal_a_riemann_sum(kind):
    decoder = build(kind)
    steps = 4
    inputs = inputs_of(decoder, steps)
    maps = explain("integrated_gradients", inputs)
    baseline = inputs.baseline.expand_as(inputs.annotations)
    difference = inputs.annotations - baseline
    # right Riemann sum of the path integral
    on_path = [gradients(decoder, baseline + k / steps * difference) for k in range(1, steps + 1)]
    for b, t in real_words():
        total = sum(grads[(b, t)] for grads in on_path)
        expected = (total / steps * difference[b]).sum(-1)
        torch.testing.assert_close(maps[b, t], expected.float(), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_attention_is_the_decoders_map(kind):
    decoder = build(kind)
    inputs = inputs_of(decoder)
    maps = explain("attention", inputs)
    alphas = decoder(inputs.annotations, inputs.scorer.captions, inputs.scorer.lengths).alphas
    for b, t in real_words():
        torch.testing.assert_close(maps[b, t], alphas[b, t].float())
        assert maps[b, t].sum().item() == pytest.approx(1.0, abs=1e-5)


def test_the_trace_is_the_transformers_forward():
    decoder = build("transformer")
    inputs = inputs_of(decoder)
    scorer = inputs.scorer
    trace = traced_forward(decoder, inputs.annotations, scorer.captions, scorer.lengths)
    torch.testing.assert_close(
        trace.logits, decoder(inputs.annotations, scorer.captions, scorer.lengths).logits
    )
    for layer in range(2):
        for head in range(2):
            decoder.set_attention_view(AttentionView(layer, head))
            alphas = decoder(inputs.annotations, scorer.captions, scorer.lengths).alphas  # (N, T, P)
            mask = scorer.word_mask
            torch.testing.assert_close(alphas[:, :5][mask], trace.cross_attention[layer][:, head, :5][mask])


def joint_matrices(trace, b: int, weights: list[np.ndarray], rule: str) -> np.ndarray:
    """R over the P + T tokens by explicit (P+T) x (P+T) matrices, one per sublayer, multiplied."""
    steps = trace.logits.size(1)
    size = P + steps
    relevance = np.eye(size)
    places = [(slice(0, P), slice(0, P))] + [
        place for _ in range(2) for place in ((slice(P, size), slice(P, size)), (slice(P, size), slice(0, P)))
    ]
    for (rows, cols), mixing in zip(places, weights, strict=True):
        matrix = np.zeros((size, size))
        matrix[rows, cols] = mixing
        if rule == "rollout":
            step = np.eye(size)
            step[rows] = 0.5 * np.eye(size)[rows] + 0.5 * matrix[rows]
        else:
            step = np.eye(size) + matrix
        relevance = step @ relevance
    return relevance


def all_weights(trace) -> list[torch.Tensor]:
    return [trace.encoder[0]] + [
        w for pair in zip(trace.self_attention, trace.cross_attention, strict=True) for w in pair
    ]


def test_rollout_by_hand_on_a_two_layer_transformer():
    decoder = build("transformer")
    inputs = inputs_of(decoder)
    maps = explain("rollout", inputs)
    scorer = inputs.scorer
    trace = traced_forward(decoder, inputs.annotations, scorer.captions, scorer.lengths)
    for b, t in real_words():
        weights = [w[b].mean(0).detach().numpy() for w in all_weights(trace)]
        relevance = joint_matrices(trace, b, weights, "rollout")
        np.testing.assert_allclose(maps[b, t].numpy(), relevance[P + t, :P], atol=1e-6)
    assert (maps[scorer.word_mask] >= 0).all()


def test_gradient_weighted_rollout_by_hand():
    decoder = build("transformer")
    inputs = inputs_of(decoder)
    maps = explain("gradient_rollout", inputs)
    scorer = inputs.scorer
    for b, t in real_words():
        trace = traced_forward(decoder, inputs.annotations, scorer.captions, scorer.lengths)
        log_probs = torch.log_softmax(trace.logits, -1)
        word = log_probs[b, t, scorer.captions[b, t + 1]]
        tensors = all_weights(trace)
        grads = torch.autograd.grad(word, tensors)
        weights = [
            (g[b] * w[b]).clamp_min(0).mean(0).detach().numpy() for g, w in zip(grads, tensors, strict=True)
        ]
        relevance = joint_matrices(trace, b, weights, "gradient_rollout")
        np.testing.assert_allclose(maps[b, t].numpy(), relevance[P + t, :P], atol=1e-6)


def test_transformer_methods_refuse_the_lstm():
    decoder = build("soft")
    with pytest.raises(InputError, match="--method rollout: explains a Transformer"):
        parse_methods("attention,rollout", decoder)
    assert parse_methods("gradient, attention,gradient") == ("gradient", "attention")
    assert {
        "attention",
        "gradient",
        "integrated_gradients",
        "gradcam",
        "occlusion",
        "rollout",
        "chefer",
        "gradient_rollout",
    } <= set(METHODS.names())
