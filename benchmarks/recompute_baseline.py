"""Incremental decoding without key/value caches: the speed baseline of the Transformer's beam search.

The most used captioning framework (ruotianluo/self-critical.pytorch) decodes its Transformer
this way; this is our own code for the same algorithm, so that ``benchmarks/speed.py`` can run it
through our ``beam_search`` with our weights. What it keeps, because that is what costs time:

* the grid encoder runs once per image (the framework's ``_prepare_feature``), and each decoding
  row (beam) holds its own copy of its image's encoded grid (the framework's ``repeat_tensors``);
* at every step the decoder runs teacher-forced over the whole prefix of every row
  (``DecoderBlock.forward`` with the causal mask), and every layer projects the cross-attention keys
  and values of the row's grid again (the framework's attention projects its memory on every call);
* only the last position goes through the output layer.

Against ``TransformerDecoder.step`` (which keeps each layer's self-attention keys and values of the
earlier words, and projects the grid's cross-attention keys and values once per image) only the
caching differs: ``tests/project/test_benchmark.py`` checks that both searches give the same captions.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from captioning.models.base import AttentionView, CaptionDecoder, StepOutput
from captioning.models.transformer import TransformerDecoder


class EncodedGrids(NamedTuple):
    """The encoded grids (B, P, d) of B images, ``group`` decoding rows per image (image-major)."""

    encoded: Tensor
    group: int = 1

    @property
    def positions(self) -> int:
        return self.encoded.size(1)

    def select(self, index: Tensor) -> EncodedGrids:
        return self._replace(encoded=self.encoded.index_select(0, index))

    def head(self, n: int) -> EncodedGrids:
        return self._replace(encoded=self.encoded[:n])


class Prefix(NamedTuple):
    """The words so far of N rows, (N, t) ids: the whole state without caches."""

    tokens: Tensor

    def select(self, index: Tensor) -> Prefix:
        return Prefix(self.tokens.index_select(0, index))


class RecomputingDecoder(CaptionDecoder):
    """A ``TransformerDecoder``'s weights decoded by recomputing each row's whole prefix at every step.

    Args:
        decoder: the Transformer whose function this computes (its modules are shared, not copied).
    """

    def __init__(self, decoder: TransformerDecoder):
        super().__init__()
        self.decoder = decoder
        self.vocab_size, self.annotation_dim = decoder.vocab_size, decoder.annotation_dim
        self.attention_layers, self.attention_heads = decoder.attention_layers, decoder.attention_heads
        self.attention_view = decoder.attention_view

    def set_attention_view(self, view: AttentionView) -> None:
        """The wrapped decoder reports ``view``'s map (its ``_reported`` chooses the map in ``step``)."""
        self.decoder.set_attention_view(view)
        self.attention_view = view

    def prepare(self, annotations: Tensor) -> EncodedGrids:
        """(B, P, C) annotations -> the encoded grids (B, P, d), once per image."""
        return EncodedGrids(self.decoder.encode_grid(annotations))

    def init_state(self, annotations: Tensor) -> Prefix:
        """No word yet: (B, 0) ids."""
        return Prefix(torch.empty(annotations.size(0), 0, dtype=torch.long, device=annotations.device))

    def step(self, prepared: EncodedGrids, tokens: Tensor, state: Prefix) -> StepOutput:
        """Append tokens (N,) to the prefixes (N, t) and run the decoder over all t + 1 positions.

        Returns the last position's log-probabilities (N, V) and cross-attention map (N, P).
        """
        decoder = self.decoder
        prefix = torch.cat([state.tokens, tokens.unsqueeze(1)], dim=1)  # (N, t+1)
        memory = prepared.encoded.repeat_interleave(prepared.group, dim=0)  # (N, P, d): a copy per row
        x = decoder._embed(prefix, torch.arange(prefix.size(1), device=prefix.device))  # (N, t+1, d)
        weights = []
        for index, block in enumerate(decoder.blocks):
            keys, values = block.memory(memory)  # (N, nh, P, dk), projected again at every step
            x, w = block(x, keys, values, decoder._needs_weights(index))
            weights.append(w)
        logits = decoder.out(decoder.final_norm(x[:, -1]))  # (N, V)
        alpha = decoder._reported(weights)[:, -1]  # (N, P)
        return StepOutput(torch.log_softmax(logits.float(), dim=-1), Prefix(prefix), alpha, None)
