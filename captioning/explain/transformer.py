"""Relevance through the Transformer's attention layers: rollout, Chefer et al.'s rules and this
project's gradient-weighted rollout.

The grid cells (P) and the caption's words (T) are the tokens. The grid encoder's self-attention mixes
cells with cells, each decoder block's masked self-attention words with words and its
cross-attention words with cells. Each method keeps relevance matrices that start as the identity (or
zero) and updates them sublayer by sublayer in the order the model runs them; a word's map is its
row's share on the grid:

- ``rollout`` (Abnar and Zuidema 2020): one matrix ``R`` (P + T, P + T) over the joint graph,
  ``R_q <- 0.5 R_q + 0.5 A R_k``, A the attention weights averaged over the heads (the residual
  connection as half of each layer's mixing).
- ``chefer`` (Chefer et al. 2021, "Generic attention-model explainability for interpreting bi-modal
  and encoder-decoder transformers", their encoder-decoder rules as ``ExplanationGenerator.py`` of
  their released code computes them): ``Abar = mean over heads of (dA * A)^+``, dA the gradient of
  the word's logit with respect to the weights A. ``R_ii`` (P, P) starts as the identity and each
  grid-encoder layer adds ``Abar R_ii``; ``R_qq`` (T, T) starts as the identity and ``R_qi`` (T, P)
  as zero; each decoder self-attention adds ``Abar R_qq`` to ``R_qq`` and ``Abar R_qi`` to ``R_qi``
  (their rules 6 and 7), each cross-attention adds ``normalise(R_qq)^T (Abar normalise(R_ii))`` to
  ``R_qi`` (rule 10), where ``normalise(R) = (R - I) / rowsum(R - I) + I`` (equations 8 and 9) and,
  as in their code, entries of the addition that the division leaves NaN (a row of ``R - I`` summing
  to 0) count 0. Word t's graph is the one its own step runs: the grid and the words up to t (the
  causal mask makes the teacher-forced pass's rows <= t equal to that step's; later words would
  only add rows of ``R - I`` summing to 0, which would zero every cross-attention update).
- ``gradient_rollout`` (this project's variant, not Chefer et al.'s): one matrix over the joint graph
  as rollout, ``R_q <- R_q + Abar R_k`` at every sublayer (the self-attention rule applied to the
  cross-attention too, without normalisation), Abar from the gradient of the word's log-probability.

The weights come from :func:`traced_forward`, the decoder's teacher-forced pass with every
attention's weights kept (its logits equal ``TransformerDecoder.forward``'s).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor

from captioning.explain.methods import ExplainInputs, register_method
from captioning.models.base import CaptionDecoder
from captioning.models.transformer import EncoderBlock, MultiHeadAttention, TransformerDecoder


@dataclass
class Trace:
    """The teacher-forced pass of N captions with every attention's weights.

    Attributes:
        logits: (N, T, V).
        encoder: per grid-encoder layer, the self-attention weights (N, nh, P, P).
        self_attention: per decoder layer, the masked self-attention weights (N, nh, T, T).
        cross_attention: per decoder layer, the cross-attention weights (N, nh, T, P).
    """

    logits: Tensor
    encoder: list[Tensor]
    self_attention: list[Tensor]
    cross_attention: list[Tensor]

    def sublayers(self, cells: int) -> list[tuple[slice, slice, Tensor]]:
        """(query rows, key rows, weights (N, nh, queries, keys)) of each sublayer in the order the
        model runs them, rows of the joint graph (the P cells first, then the T words)."""
        words = self.logits.size(1)
        grid, text = slice(0, cells), slice(cells, cells + words)
        layers = [(grid, grid, weights) for weights in self.encoder]
        for self_weights, cross_weights in zip(self.self_attention, self.cross_attention, strict=True):
            layers += [(text, text, self_weights), (text, grid, cross_weights)]
        return layers


def _attend(
    attention: MultiHeadAttention, x: Tensor, source: Tensor, kept: list[Tensor], causal: bool = False
) -> Tensor:
    """Multi-head attention of x (N, T, d) over source (N, S, d), its weights (N, nh, T, S) appended
    to ``kept``."""
    queries = attention.heads(attention.query(x))  # (N, nh, T, dk)
    keys, values = attention.keys_values(source)  # (N, nh, S, dk)
    scores = queries @ keys.transpose(-1, -2) / math.sqrt(attention.head_dim)  # (N, nh, T, S)
    if causal:
        later = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).triu(1)
        scores = scores.masked_fill(later, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    kept.append(weights)
    return attention.out((weights @ values).transpose(-3, -2).flatten(-2))


def traced_forward(
    decoder: TransformerDecoder, annotations: Tensor, captions: Tensor, lengths: Tensor
) -> Trace:
    """``decoder.forward`` for caption n of image n, keeping every attention's weights.

    Args:
        annotations: (N, P, C); captions (N, L) ``<start> .. <end>``; lengths (N,).
    """
    steps = int(lengths.max().item()) - 1
    encoder: list[Tensor] = []
    x = decoder.dropout(decoder.grid_projection(annotations) + decoder.grid_code)  # (N, P, d)
    for grid_block in cast("Iterable[EncoderBlock]", decoder.grid_encoder):
        x = grid_block.residual(x, 0, lambda h, b=grid_block: _attend(b.attention, h, h, encoder))
        x = grid_block.residual(x, 1, grid_block.feed_forward)
    encoded = decoder.grid_norm(x)
    self_weights: list[Tensor] = []
    cross_weights: list[Tensor] = []
    x = decoder._embed(captions[:, :steps], torch.arange(steps, device=captions.device))  # (N, T, d)
    for block in decoder._decoder_blocks():
        x = block.residual(
            x, 0, lambda h, block=block: _attend(block.self_attention, h, h, self_weights, causal=True)
        )
        x = block.residual(
            x, 1, lambda h, block=block: _attend(block.cross_attention, h, encoded, cross_weights)
        )
        x = block.residual(x, 2, block.feed_forward)
    return Trace(decoder.out(decoder.final_norm(x)), encoder, self_weights, cross_weights)


def propagate(sublayers: list[tuple[slice, slice, Tensor]], size: int, rule: str) -> Tensor:
    """The relevance R (N, size, size) of the joint graph after ``sublayers`` (query rows, key rows,
    head-aggregated weights (N, queries, keys)), by the ``rollout`` rule (``0.5 R_q + 0.5 A R_k``) or
    the ``gradient_rollout`` one (``R_q + A R_k``)."""
    images = sublayers[0][2].size(0)
    first = sublayers[0][2]
    relevance = torch.eye(size, dtype=first.dtype, device=first.device).expand(images, size, size)
    for queries, keys, weights in sublayers:
        mixed = weights @ relevance[:, keys]  # (N, queries, size)
        updated = (
            0.5 * relevance[:, queries] + 0.5 * mixed if rule == "rollout" else relevance[:, queries] + mixed
        )
        relevance = torch.cat([relevance[:, : queries.start], updated, relevance[:, queries.stop :]], dim=1)
    return relevance


def _not_transformer(decoder: CaptionDecoder) -> str | None:
    if isinstance(decoder, TransformerDecoder):
        return None
    return (
        f"explains a Transformer decoder's attention layers; this model's decoder is {type(decoder).__name__}"
    )


def _trace(inputs: ExplainInputs) -> Trace:
    scorer = inputs.scorer
    decoder = inputs.decoder
    assert isinstance(decoder, TransformerDecoder)  # _not_transformer refused the others
    return traced_forward(decoder, inputs.annotations, scorer.captions, scorer.lengths)


@register_method("rollout", _not_transformer, baseline=False)
def rollout(inputs: ExplainInputs) -> Tensor:
    """Attention rollout over every layer (Abnar and Zuidema 2020), heads averaged."""
    cells, words = inputs.annotations.size(1), inputs.scorer.words
    with torch.no_grad():
        trace = _trace(inputs)
        sublayers = [(q, k, w.mean(dim=1)) for q, k, w in trace.sublayers(cells)]
        relevance = propagate(sublayers, cells + trace.logits.size(1), "rollout")
    return relevance[:, cells : cells + words, :cells]


@register_method("gradient_rollout", _not_transformer, baseline=False)
def gradient_rollout(inputs: ExplainInputs) -> Tensor:
    """Gradient-weighted attention rollout (this project's variant): R_q += Abar R_k at every sublayer."""
    scorer = inputs.scorer
    cells, words = inputs.annotations.size(1), scorer.words
    maps = []
    with torch.enable_grad():
        trace = _trace(inputs)
        chosen = scorer.scores_of(trace.logits)  # (N, T) each word's score (ExplainConfig.score)
        sublayers = trace.sublayers(cells)
        weights = [w for _, _, w in sublayers]
        for t in range(words):
            gradients = torch.autograd.grad(chosen[:, t].sum(), weights, retain_graph=t + 1 < words)
            weighted = [
                (q, k, _gradient_weighted(w, g)) for (q, k, w), g in zip(sublayers, gradients, strict=True)
            ]
            relevance = propagate(weighted, cells + trace.logits.size(1), "gradient_rollout")
            maps.append(relevance[:, cells + t, :cells])
    return torch.stack(maps, dim=1)


def _gradient_weighted(weights: Tensor, gradients: Tensor) -> Tensor:
    """Abar = mean over heads of (dA * A)^+: (N, nh, q, k) -> (N, q, k), detached."""
    return (gradients * weights).clamp_min(0).mean(dim=1).detach()


def normalise_residual(relevance: Tensor) -> Tensor:
    """Chefer et al.'s equations 8 and 9: ``(R - I) / rowsum(R - I) + I`` of (N, n, n) matrices; a row
    of ``R - I`` summing to 0 gives NaN, as in their code."""
    eye = torch.eye(relevance.size(-1), dtype=relevance.dtype, device=relevance.device)
    shifted = relevance - eye
    return shifted / shifted.sum(dim=-1, keepdim=True) + eye


def chefer_relevance(encoder: list[Tensor], self_attention: list[Tensor], cross: list[Tensor]) -> Tensor:
    """``R_qi`` (N, T, P) of Chefer et al.'s encoder-decoder rules from the head-aggregated Abar.

    Args:
        encoder: per grid-encoder layer, Abar (N, P, P).
        self_attention: per decoder layer, Abar of its self-attention (N, T, T).
        cross: per decoder layer, Abar of its cross-attention (N, T, P).
    """
    first = cross[0]
    images, words, cells = first.shape
    grid = torch.eye(cells, dtype=first.dtype, device=first.device).expand(images, cells, cells)  # R_ii
    for weights in encoder:
        grid = grid + weights @ grid
    text = torch.eye(words, dtype=first.dtype, device=first.device).expand(images, words, words)  # R_qq
    relevance = first.new_zeros(images, words, cells)  # R_qi
    grid_normalised = normalise_residual(grid)
    for self_weights, cross_weights in zip(self_attention, cross, strict=True):
        text, relevance = text + self_weights @ text, relevance + self_weights @ relevance
        addition = normalise_residual(text).transpose(1, 2) @ (cross_weights @ grid_normalised)
        relevance = relevance + torch.nan_to_num(addition, nan=0.0)
    return relevance


def _no_grid_self_attention(decoder: CaptionDecoder) -> str | None:
    reason = _not_transformer(decoder)
    if reason is None and not len(cast("TransformerDecoder", decoder).grid_encoder):
        return (
            "needs the grid encoder's self-attention (model.decoder.encoder_layers is 0: Chefer et al.'s "
            "normalisation of R_ii then divides by zero and every map is 0); use gradient_rollout"
        )
    return reason


@register_method("chefer", _no_grid_self_attention, baseline=False)
def chefer(inputs: ExplainInputs) -> Tensor:
    """Chefer et al. 2021's encoder-decoder relevance rules, the word's logit explained."""
    scorer = inputs.scorer
    words = scorer.words
    maps = []
    with torch.enable_grad():
        trace = _trace(inputs)
        targets = scorer.captions[:, 1 : words + 1]  # (N, T)
        chosen = trace.logits[:, :words].gather(2, targets.unsqueeze(2)).squeeze(2)  # (N, T) logits
        tensors = [*trace.encoder, *trace.self_attention, *trace.cross_attention]
        layers = len(trace.self_attention)
        for t in range(words):
            gradients = torch.autograd.grad(chosen[:, t].sum(), tensors, retain_graph=t + 1 < words)
            weighted = [_gradient_weighted(w, g) for w, g in zip(tensors, gradients, strict=True)]
            encoder, decoder = weighted[: len(trace.encoder)], weighted[len(trace.encoder) :]
            prefix = slice(0, t + 1)  # word t's step sees the words up to t
            relevance = chefer_relevance(
                encoder,
                [w[:, prefix, prefix] for w in decoder[:layers]],
                [w[:, prefix] for w in decoder[layers:]],
            )
            maps.append(relevance[:, t])
    return torch.stack(maps, dim=1)
