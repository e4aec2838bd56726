"""``chefer`` equals an independent transcription of Chefer et al. 2021's encoder-decoder rules
(``ExplanationGenerator.py`` of their released code: ``avg_heads``, ``apply_self_attention_rules``,
``handle_residual``, ``apply_mm_attention_rules``), written here with numpy loops over the attention
weights and gradients of a tiny Transformer's pass on each word's own prefix."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from messages import raises_naming

from captioning.config import TransformerDecoderConfig
from captioning.explain import ExplainInputs, ExplainSettings, explain
from captioning.explain.methods import parse_methods
from captioning.explain.scoring import WordScorer, caption_tensor
from captioning.explain.transformer import chefer_relevance, traced_forward
from captioning.models.transformer import TransformerDecoder
from captioning.utils.errors import InputError

pytestmark = pytest.mark.usefixtures("single_thread")

V, C, GRID = 11, 5, (2, 3)
P = GRID[0] * GRID[1]
TOKENS = [[4, 7, 5], [6, 8, 9, 10, 4]]


def build(encoder_layers: int = 2) -> TransformerDecoder:
    torch.manual_seed(3)
    config = TransformerDecoderConfig(
        d_model=12, num_heads=3, d_ff=16, encoder_layers=encoder_layers, decoder_layers=2, dropout=0.0
    )
    return TransformerDecoder.from_config(config, V, C, GRID).double().eval()


def inputs_of(decoder: TransformerDecoder) -> ExplainInputs:
    torch.manual_seed(1)
    annotations = torch.rand(2, P, C, dtype=torch.float64)
    captions, lengths = caption_tensor(TOKENS, 1, 2)
    baseline = torch.rand(C, dtype=torch.float64)
    return ExplainInputs(WordScorer(decoder, captions, lengths), annotations, baseline, ExplainSettings(4, 5))


def avg_heads(cam: np.ndarray, grad: np.ndarray) -> np.ndarray:
    """Rule 5: the mean over heads of (grad * cam)^+; (nh, q, k) -> (q, k)."""
    heads, rows, cols = cam.shape
    out = np.zeros((rows, cols))
    for h in range(heads):
        for i in range(rows):
            for j in range(cols):
                out[i, j] += max(grad[h, i, j] * cam[h, i, j], 0.0) / heads
    return out


def handle_residual(relevance: np.ndarray) -> np.ndarray:
    """Equations 8 and 9: subtract the identity, divide each row by its sum, add the identity back."""
    n = relevance.shape[0]
    out = relevance - np.eye(n)
    assert min(out[i, i] for i in range(n)) >= 0
    for i in range(n):
        total = out[i].sum()
        for j in range(n):
            out[i, j] = out[i, j] / total if total != 0 else float("nan")  # torch's 0/0
    return out + np.eye(n)


def reference_map(
    decoder: TransformerDecoder, annotations: torch.Tensor, tokens: list[int], t: int
) -> np.ndarray:
    """The reference's R_qi row of word t, on the pass over ``<start> w_1 .. w_t`` (t + 1 queries)
    with the target word w_{t+1}'s logit differentiated."""
    captions, lengths = caption_tensor([tokens[: t + 1]], 1, 2)  # <start> w_1 .. w_{t+1} <end>
    captions, lengths = captions[:, : t + 2], lengths.clamp(max=t + 2)  # queries: <start> .. w_t
    trace = traced_forward(decoder, annotations[None], captions, lengths)
    assert trace.logits.size(1) == t + 1
    target = trace.logits[0, t, tokens[t]]
    maps = [*trace.encoder, *trace.self_attention, *trace.cross_attention]
    grads = torch.autograd.grad(target, maps)
    cams = [avg_heads(m[0].detach().numpy(), g[0].numpy()) for m, g in zip(maps, grads, strict=True)]
    layers = len(trace.self_attention)
    encoder_cams, self_cams = cams[: len(trace.encoder)], cams[len(trace.encoder) : -layers]
    return reference_relevance(encoder_cams, self_cams, cams[-layers:])[t]


def reference_relevance(encoder_cams, self_cams, cross_cams) -> np.ndarray:
    """Their generator's R_qi (queries, cells) from the head-aggregated maps of each sublayer."""
    cells, queries = encoder_cams[0].shape[0], self_cams[0].shape[0]
    r_ii = np.eye(cells)
    for cam in encoder_cams:  # handle_self_attention_image
        r_ii = r_ii + cam @ r_ii
    r_qq, r_qi = np.eye(queries), np.zeros((queries, cells))
    for cam_ss, cam_sq in zip(self_cams, cross_cams, strict=True):
        r_qq_add, r_qi_add = cam_ss @ r_qq, cam_ss @ r_qi  # apply_self_attention_rules
        r_qq, r_qi = r_qq + r_qq_add, r_qi + r_qi_add
        with np.errstate(invalid="ignore"):
            addition = handle_residual(r_qq).T @ (cam_sq @ handle_residual(r_ii))  # apply_mm_attention_rules
        addition[np.isnan(addition)] = 0
        r_qi = r_qi + addition
    return r_qi


def test_chefer_equals_the_reference_rules():
    decoder = build()
    inputs = inputs_of(decoder)
    maps = explain("chefer", inputs)
    for b, tokens in enumerate(TOKENS):
        for t in range(len(tokens)):
            expected = reference_map(decoder, inputs.annotations[b], tokens, t)
            np.testing.assert_allclose(maps[b, t].numpy(), expected, atol=1e-6)
    assert maps[0, 3:].abs().max() == 0  # after the first caption's end
    assert maps.abs().sum() > 0


@pytest.mark.parametrize("silent_row", [None, 2])
def test_the_rules_zero_an_update_the_normalisation_leaves_undefined(silent_row):
    # A word whose self-attention rows are 0 in every layer leaves a row of R_qq - I summing to 0:
    # their division gives NaN there, and their generator sets the whole NaN update to 0.
    rng = np.random.default_rng(0)
    queries, cells = 4, 6
    encoder = [rng.random((cells, cells)) for _ in range(2)]
    self_cams = [np.tril(rng.random((queries, queries))) for _ in range(2)]
    cross = [rng.random((queries, cells)) for _ in range(2)]
    if silent_row is not None:
        for cam in self_cams:
            cam[silent_row] = 0.0
    expected = reference_relevance(encoder, self_cams, cross)
    actual = chefer_relevance(
        *([torch.tensor(m)[None] for m in group] for group in (encoder, self_cams, cross))
    )
    np.testing.assert_allclose(actual[0].numpy(), expected, atol=1e-12)
    assert (expected == 0).all() if silent_row is not None else (expected > 0).all()


def test_chefer_differs_from_the_project_variant():
    decoder = build()
    inputs = inputs_of(decoder)
    chefer, variant = explain("chefer", inputs), explain("gradient_rollout", inputs)
    assert not torch.allclose(chefer[1, :5], variant[1, :5])


def test_chefer_refuses_a_grid_without_self_attention():
    decoder = build(encoder_layers=0)
    with raises_naming(InputError, "--method chefer", "encoder_layers", "gradient_rollout"):
        parse_methods("chefer", decoder)
    assert parse_methods("gradient_rollout,rollout", decoder) == ("gradient_rollout", "rollout")
