"""Relevance through the Transformer's attention layers: rollout and gradient-weighted attention.

The grid cells (P) and the caption's words (T) are one graph of P + T tokens. Each attention sublayer
mixes the representations of its query tokens with those of its keys: the grid encoder's
self-attention (grid -> grid), each decoder block's masked self-attention (words -> words) and its
cross-attention (words -> grid). ``R`` (P + T, P + T) says how much of each token's representation
comes from each input token; it starts as the identity and every sublayer updates the rows of its
queries from the rows of its keys, in the order the model runs them:

- ``rollout`` (Abnar and Zuidema 2020): ``R_q <- 0.5 R_q + 0.5 A R_k``, A the attention weights
  averaged over the heads (the residual connection as half of each layer's mixing);
- ``chefer`` (Chefer et al. 2021, "Generic attention-model explainability"):
  ``R_q <- R_q + Abar R_k`` with ``Abar = mean over heads of (dA * A)^+``, dA the gradient of the
  explained word's log-probability with respect to the weights A (their rule for self-attention,
  applied to every sublayer of the graph; their normalisation of the cross-attention update is
  left out).

A word's map is its row's share on the grid, ``R[P + t, :P]``. The weights come from
:func:`traced_forward`, the decoder's teacher-forced pass with every attention's weights kept (its
logits equal ``TransformerDecoder.forward``'s).
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
    head-aggregated weights (N, queries, keys)), by the ``rollout`` or ``chefer`` rule."""
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


@register_method("rollout", _not_transformer)
def rollout(inputs: ExplainInputs) -> Tensor:
    """Attention rollout over every layer (Abnar and Zuidema 2020), heads averaged."""
    cells, words = inputs.annotations.size(1), inputs.scorer.words
    with torch.no_grad():
        trace = _trace(inputs)
        sublayers = [(q, k, w.mean(dim=1)) for q, k, w in trace.sublayers(cells)]
        relevance = propagate(sublayers, cells + trace.logits.size(1), "rollout")
    return relevance[:, cells : cells + words, :cells]


@register_method("chefer", _not_transformer)
def chefer(inputs: ExplainInputs) -> Tensor:
    """Gradient-weighted attention over layers and heads (Chefer et al. 2021)."""
    scorer = inputs.scorer
    cells, words = inputs.annotations.size(1), scorer.words
    maps = []
    with torch.enable_grad():
        trace = _trace(inputs)
        log_probs = torch.log_softmax(
            trace.logits, dim=-1, dtype=torch.promote_types(trace.logits.dtype, torch.float32)
        )
        targets = scorer.captions[:, 1 : words + 1]  # (N, T)
        chosen = log_probs[:, :words].gather(2, targets.unsqueeze(2)).squeeze(2)  # (N, T)
        sublayers = trace.sublayers(cells)
        weights = [w for _, _, w in sublayers]
        for t in range(words):
            gradients = torch.autograd.grad(chosen[:, t].sum(), weights, retain_graph=t + 1 < words)
            weighted = [
                (q, k, (g * w).clamp_min(0).mean(dim=1).detach())
                for (q, k, w), g in zip(sublayers, gradients, strict=True)
            ]
            relevance = propagate(weighted, cells + trace.logits.size(1), "chefer")
            maps.append(relevance[:, cells + t, :cells])
    return torch.stack(maps, dim=1)
