"""A Transformer caption decoder over the annotation grid (Vaswani et al. 2017), beside the LSTM.

The grid is projected to ``d_model``, given a 2-D sinusoidal position code (half the channels
encode the row, half the column) and passed through ``encoder_layers`` self-attention blocks,
once per image. Every decoder block is masked self-attention over the words so far,
cross-attention over the encoded grid and a feed-forward layer, each in a residual branch with
LayerNorm after it (the original block) or before it (``pre_norm``).

Teacher forcing runs all steps at once with ``F.scaled_dot_product_attention``; only the layers
the attention view names (``CaptionDecoder.set_attention_view``) compute their cross-attention
weights explicitly, to report them as ``alphas``. Incremental decoding keeps each layer's
self-attention keys and values in the state (``TransformerState``; beam search reorders them with
``select``), and each layer's cross-attention keys and values are projected once per image in
``prepare`` and read by all of that image's beams or samples (``TransformerPrepared.group``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from captioning.config import TransformerDecoderConfig
from captioning.models.base import CaptionDecoder, DecoderOutput, StepOutput, register_decoder


def sinusoids(positions: Tensor, dim: int) -> Tensor:
    """The sine/cosine position code of Vaswani et al.: (L,) positions -> (L, dim)."""
    frequencies = torch.exp(
        torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) * (-math.log(10000.0) / dim)
    )  # (ceil(dim/2),)
    angles = positions.float().unsqueeze(1) * frequencies  # (L, ceil(dim/2))
    code = torch.zeros(positions.numel(), dim, device=positions.device)
    code[:, 0::2] = torch.sin(angles)
    code[:, 1::2] = torch.cos(angles[:, : dim // 2])
    return code


def grid_positions(grid: tuple[int, int], dim: int, device: torch.device | None = None) -> Tensor:
    """(P, dim) code of a row-major (gh, gw) grid: the row's code in the first half, the column's after."""
    rows, columns = grid
    row_dim = dim // 2
    row_code = sinusoids(torch.arange(rows, device=device), row_dim)  # (gh, dim/2)
    column_code = sinusoids(torch.arange(columns, device=device), dim - row_dim)  # (gw, dim/2)
    return torch.cat(
        [
            row_code.unsqueeze(1).expand(rows, columns, row_dim),
            column_code.unsqueeze(0).expand(rows, columns, dim - row_dim),
        ],
        dim=2,
    ).flatten(0, 1)


class TransformerPrepared(NamedTuple):
    """Each decoder layer's cross-attention keys and values of B images, made once per image.

    ``group`` rows of the decoder share each image, image-major (as ``attention.Prepared``).
    """

    keys: tuple[Tensor, ...]  # per layer (B, nh, P, dk)
    values: tuple[Tensor, ...]  # per layer (B, nh, P, dk)
    group: int = 1

    @property
    def positions(self) -> int:
        return self.keys[0].shape[-2]

    def select(self, index: Tensor) -> TransformerPrepared:
        return self._replace(
            keys=tuple(k.index_select(0, index) for k in self.keys),
            values=tuple(v.index_select(0, index) for v in self.values),
        )

    def head(self, n: int) -> TransformerPrepared:
        return self._replace(keys=tuple(k[:n] for k in self.keys), values=tuple(v[:n] for v in self.values))


class TransformerState(NamedTuple):
    """The words so far of N rows, as each layer's self-attention keys and values (N, nh, t, dk)."""

    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]

    @property
    def length(self) -> int:
        return self.keys[0].size(2)

    def select(self, index: Tensor) -> TransformerState:
        """Rows ``index`` of every layer's cache (beam reordering, repeating an image's rows)."""
        return TransformerState(
            tuple(k.index_select(0, index) for k in self.keys),
            tuple(v.index_select(0, index) for v in self.values),
        )


# The blocks' incremental step (TransformerDecoder._step_blocks): x, caches, memory -> x, caches, weights.
StepBlocks = Callable[
    [Tensor, TransformerState, TransformerPrepared], tuple[Tensor, TransformerState, list[Tensor | None]]
]


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention with separate query, key and value projections.

    The keys have no bias: it would add the same score to every position of a query, which the
    softmax ignores, so its gradient is zero up to rounding, and Adam would turn that rounding
    noise into full-size updates (as in Whisper's attention).
    """

    def __init__(self, d_model: int, num_heads: int):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, d_model // num_heads
        self.query = nn.Linear(d_model, d_model)
        self.key = nn.Linear(d_model, d_model, bias=False)
        self.value = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)

    def heads(self, x: Tensor) -> Tensor:
        """(..., T, d) -> (..., nh, T, dk)."""
        return x.unflatten(-1, (self.num_heads, self.head_dim)).transpose(-3, -2)

    def keys_values(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values (N, nh, S, dk) of the attended sequence x (N, S, d)."""
        return self.heads(self.key(x)), self.heads(self.value(x))

    def weights(self, queries: Tensor, keys: Tensor) -> Tensor:
        """softmax(q k^T / sqrt(dk)): (..., nh, T, dk), (..., nh, S, dk) -> (..., nh, T, S)."""
        return torch.softmax(queries @ keys.transpose(-1, -2) / math.sqrt(self.head_dim), dim=-1)

    def forward(
        self, x: Tensor, keys: Tensor, values: Tensor, causal: bool = False, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Queries from x (N, T, d) over keys and values (N, nh, S, dk) -> (N, T, d) and, with
        ``need_weights`` (never together with ``causal``), the weights (N, nh, T, S)."""
        queries = self.heads(self.query(x))  # (N, nh, T, dk)
        if need_weights:  # the same product, with the weights kept for the figures and the penalty
            weights = self.weights(queries, keys)
            context = weights @ values
        else:
            weights, context = None, F.scaled_dot_product_attention(queries, keys, values, is_causal=causal)
        return self.out(context.transpose(-3, -2).flatten(-2)), weights


class Block(nn.Module):
    """Residual sublayers with LayerNorm after each (the original block) or before each (``pre_norm``)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float, pre_norm: bool, sublayers: int):
        super().__init__()
        self.pre_norm = pre_norm
        self.feed_forward = nn.Sequential(
            nn.Linear(d_model, d_ff), nn.ReLU(), nn.Dropout(dropout), nn.Linear(d_ff, d_model)
        )
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(sublayers))
        self.dropout = nn.Dropout(dropout)

    def residual(self, x: Tensor, index: int, sublayer) -> Tensor:
        """x + dropout(sublayer(norm(x))) (pre-norm) or norm(x + dropout(sublayer(x))) (post-norm)."""
        norm = self.norms[index]
        if self.pre_norm:
            return x + self.dropout(sublayer(norm(x)))
        return norm(x + self.dropout(sublayer(x)))


class EncoderBlock(Block):
    """Self-attention over the grid cells, then feed-forward."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float, pre_norm: bool):
        super().__init__(d_model, d_ff, dropout, pre_norm, sublayers=2)
        self.attention = MultiHeadAttention(d_model, num_heads)

    def forward(self, x: Tensor) -> Tensor:
        """(B, P, d) -> (B, P, d)."""
        x = self.residual(x, 0, lambda h: self.attention(h, *self.attention.keys_values(h))[0])
        return self.residual(x, 1, self.feed_forward)


class DecoderBlock(Block):
    """Masked self-attention over the words, cross-attention over the grid, feed-forward."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float, pre_norm: bool):
        super().__init__(d_model, d_ff, dropout, pre_norm, sublayers=3)
        self.self_attention = MultiHeadAttention(d_model, num_heads)
        self.cross_attention = MultiHeadAttention(d_model, num_heads)

    def memory(self, encoded: Tensor) -> tuple[Tensor, Tensor]:
        """Cross-attention keys and values (B, nh, P, dk) of the encoded grid (B, P, d)."""
        return self.cross_attention.keys_values(encoded)

    def forward(
        self, x: Tensor, keys: Tensor, values: Tensor, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """All T steps of N captions at once: x (N, T, d), memory (N, nh, P, dk).

        Returns the new x and, with ``need_weights``, the cross-attention weights (N, nh, T, P).
        """
        x = self.residual(
            x, 0, lambda h: self.self_attention(h, *self.self_attention.keys_values(h), causal=True)[0]
        )
        weights = None

        def cross(h: Tensor) -> Tensor:
            nonlocal weights
            context, weights = self.cross_attention(h, keys, values, need_weights=need_weights)
            return context

        x = self.residual(x, 1, cross)
        return self.residual(x, 2, self.feed_forward), weights

    def step(
        self, x: Tensor, cache_keys: Tensor, cache_values: Tensor, memory_keys: Tensor, memory_values: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """One new word of N rows: x (N, d), caches (N, nh, t, dk), memory (B, nh, P, dk) with N = B * G.

        Returns the new x, the caches with this word appended (N, nh, t+1, dk) and the
        cross-attention weights (N, nh, P).
        """
        new_keys, new_values = cache_keys, cache_values

        def self_attention(h: Tensor) -> Tensor:
            nonlocal new_keys, new_values
            keys, values = self.self_attention.keys_values(h.unsqueeze(1))  # (N, nh, 1, dk)
            new_keys, new_values = (
                torch.cat([cache_keys, keys], dim=2),
                torch.cat([cache_values, values], dim=2),
            )
            # The cache holds only this and earlier words: no mask is needed.
            return self.self_attention(h.unsqueeze(1), new_keys, new_values)[0].squeeze(1)

        weights = None

        def cross_attention(h: Tensor) -> Tensor:
            nonlocal weights
            attention = self.cross_attention
            images = memory_keys.size(0)
            # The G rows of an image query its one copy of the memory: (N, d) -> (B, nh, G, dk).
            queries = attention.heads(attention.query(h).view(images, -1, h.size(-1)))
            grouped = attention.weights(queries, memory_keys)  # (B, nh, G, P)
            context = (grouped @ memory_values).transpose(1, 2).flatten(2).flatten(0, 1)  # (N, d)
            weights = grouped.transpose(1, 2).flatten(0, 1)  # (N, nh, P)
            return attention.out(context)

        x = self.residual(x, 0, self_attention)
        x = self.residual(x, 1, cross_attention)
        assert weights is not None  # set by cross_attention, which residual has just run
        return self.residual(x, 2, self.feed_forward), new_keys, new_values, weights


@register_decoder("transformer", TransformerDecoderConfig)
class TransformerDecoder(CaptionDecoder):
    """Grid encoder + Transformer decoder, with the LSTM's interface (``CaptionDecoder``).

    Args:
        vocab_size: V, including the special tokens.
        annotation_dim: C, channels of the encoder grid.
        grid: (gh, gw), the grid the P = gh * gw annotation vectors come from (row-major).
        d_model, num_heads, d_ff: the block sizes.
        encoder_layers: self-attention blocks over the grid (0: the projected grid is the memory).
        decoder_layers: decoder blocks.
        dropout: on the embeddings and every residual branch.
        pre_norm: LayerNorm before each sublayer (and once after each stack) instead of after.
        tie_embeddings: the output layer's weight is the embedding matrix.
    """

    input_weight = "grid_projection.weight"
    layered = True
    grid_code: Tensor  # (P, d) buffer: the position code of the grid

    def __init__(
        self,
        vocab_size: int,
        annotation_dim: int,
        grid: tuple[int, int],
        d_model: int = 512,
        num_heads: int = 8,
        d_ff: int = 2048,
        encoder_layers: int = 3,
        decoder_layers: int = 3,
        dropout: float = 0.1,
        pre_norm: bool = False,
        tie_embeddings: bool = True,
    ):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} is not divisible by num_heads {num_heads}")
        rows, columns = grid
        self.vocab_size, self.annotation_dim, self.d_model = vocab_size, annotation_dim, d_model
        self.grid = (rows, columns)
        self.attention_layers, self.attention_heads = decoder_layers, num_heads
        self.grid_projection = nn.Linear(annotation_dim, d_model)
        self.register_buffer("grid_code", grid_positions(self.grid, d_model), persistent=False)  # (P, d)
        self.grid_encoder = nn.ModuleList(
            EncoderBlock(d_model, num_heads, d_ff, dropout, pre_norm) for _ in range(encoder_layers)
        )
        # Pre-norm leaves the residual stream unnormalised: one LayerNorm after each stack.
        self.grid_norm = nn.LayerNorm(d_model) if pre_norm and encoder_layers else nn.Identity()
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList(
            DecoderBlock(d_model, num_heads, d_ff, dropout, pre_norm) for _ in range(decoder_layers)
        )
        self.final_norm = nn.LayerNorm(d_model) if pre_norm else nn.Identity()
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(d_model, vocab_size)
        # The compiled incremental step of the blocks, once compile_step has made it.
        self._compiled_step_blocks: StepBlocks | None = None
        self.reset_parameters()
        if tie_embeddings:
            self.out.weight = self.embedding.weight

    def reset_parameters(self) -> None:
        """Glorot-uniform matrices (as the reference implementations); the embedding N(0, d^-1/2)."""
        for name, parameter in self.named_parameters():
            if parameter.dim() > 1 and not name.startswith("embedding"):
                nn.init.xavier_uniform_(parameter)
        nn.init.normal_(self.embedding.weight, 0.0, self.d_model**-0.5)

    @classmethod
    def from_config(
        cls, config: TransformerDecoderConfig, vocab_size: int, annotation_dim: int, grid: tuple[int, int]
    ) -> TransformerDecoder:
        """The Transformer described by ``config`` for a (gh, gw) grid of C-channel annotations."""
        return cls(
            vocab_size,
            annotation_dim,
            grid,
            config.d_model,
            config.num_heads,
            config.d_ff,
            config.encoder_layers,
            config.decoder_layers,
            config.dropout,
            config.pre_norm,
            config.tie_embeddings,
        )

    def compile_step(self, backend: str = "inductor") -> None:
        """``torch.compile`` the blocks' incremental step (dynamic batch and prefix length)."""
        self._compiled_step_blocks = torch.compile(self._step_blocks, dynamic=True, backend=backend)

    # ----------------------------------------------------------------- per-image work, done once
    def encode_grid(self, annotations: Tensor) -> Tensor:
        """(B, P, C) annotations -> (B, P, d) encoded grid."""
        if annotations.size(1) != self.grid_code.size(0):
            raise ValueError(
                f"the decoder was built for a {self.grid[0]}x{self.grid[1]} grid "
                f"({self.grid_code.size(0)} positions), got {annotations.size(1)} positions"
            )
        encoded = self.dropout(self.grid_projection(annotations) + self.grid_code)  # (B, P, d)
        for block in self.grid_encoder:
            encoded = block(encoded)
        return self.grid_norm(encoded)

    def prepare(self, annotations: Tensor) -> TransformerPrepared:
        """Encode the grid and project every layer's cross-attention keys and values, once per image."""
        encoded = self.encode_grid(annotations)
        memories = [block.memory(encoded) for block in self._decoder_blocks()]
        return TransformerPrepared(tuple(k for k, _ in memories), tuple(v for _, v in memories))

    def init_state(self, annotations: Tensor) -> TransformerState:
        """Empty caches (B, nh, 0, dk) per layer: no word yet."""
        empty = annotations.new_zeros(
            annotations.size(0), self.attention_heads, 0, self.d_model // self.attention_heads
        )
        return TransformerState((empty,) * len(self.blocks), (empty,) * len(self.blocks))

    # ----------------------------------------------------------------- the attention view
    def _reported(self, weights: list[Tensor | None]) -> Tensor:
        """The view's map from per-layer weights (N, nh, ..., P): a layer or the mean, a head or the mean."""
        layer, head = self.attention_view.layer, self.attention_view.head
        chosen = (
            torch.stack([w for w in weights if w is not None]).mean(0) if layer is None else weights[layer]
        )
        assert chosen is not None  # the viewed layer computes its weights (_needs_weights)
        return chosen.mean(dim=1) if head is None else chosen[:, head]

    def _needs_weights(self, index: int) -> bool:
        layer = self.attention_view.layer
        return layer is None or index == layer % len(self.blocks)

    # ----------------------------------------------------------------- decoding
    def _embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """Scaled embeddings plus the position code: (..., ) ids at (T,) positions -> (..., d)."""
        code = sinusoids(positions, self.d_model).to(self.embedding.weight.dtype)
        return self.dropout(self.embedding(tokens) * math.sqrt(self.d_model) + code)

    def _decoder_blocks(self) -> Iterable[DecoderBlock]:
        """The decoder blocks (``nn.ModuleList`` types its items as plain modules)."""
        return cast("Iterable[DecoderBlock]", self.blocks)

    def _step_blocks(
        self, x: Tensor, state: TransformerState, prepared: TransformerPrepared
    ) -> tuple[Tensor, TransformerState, list[Tensor | None]]:
        """One word through every block: x (N, d) -> (N, d), the grown caches and each layer's
        cross-attention weights (N, nh, P)."""
        keys, values = [], []
        weights: list[Tensor | None] = []
        for block, cache_k, cache_v, memory_k, memory_v in zip(
            self._decoder_blocks(), state.keys, state.values, prepared.keys, prepared.values, strict=True
        ):
            x, k, v, w = block.step(x, cache_k, cache_v, memory_k, memory_v)
            keys.append(k)
            values.append(v)
            weights.append(w)
        return self.final_norm(x), TransformerState(tuple(keys), tuple(values)), weights

    def step(self, prepared: TransformerPrepared, tokens: Tensor, state: TransformerState) -> StepOutput:
        """Advance N rows by one word: tokens (N,), caches of t words -> log-probs (N, V), alpha (N, P)."""
        # (1,) from the cache's length: traced as such (torch.tensor would be a constant in an ONNX graph)
        position = torch.arange(state.length, state.length + 1, device=tokens.device)
        x = self._embed(tokens, position)  # (N, d)
        x, state, weights = (self._compiled_step_blocks or self._step_blocks)(x, state, prepared)
        logits = self.out(x).float()  # (N, V)
        return StepOutput(
            torch.log_softmax(logits, dim=-1), state, self._reported(weights), None, logits=logits
        )

    def forward(
        self, annotations: Tensor, captions: Tensor, lengths: Tensor, image_index: Tensor | None = None
    ) -> DecoderOutput:
        """Teacher-forced decoding of N captions, all steps at once (see ``ShowAttendTellDecoder.forward``).

        Args:
            annotations: (B, P, C) grids; captions (N, L) ``<start> .. <end>`` padded with 0; lengths (N,).
            image_index: (N,) image row of each caption; None when caption i belongs to image i.
        Returns:
            ``DecoderOutput`` with T = max(lengths) - 1 steps; ``alphas`` the attention view's map,
            zero after each caption's end. A step reads only earlier words (causal mask), so the
            padding after a caption changes none of its real steps.
        """
        steps = int(lengths.max().item()) - 1
        prepared = self.prepare(annotations)
        if image_index is not None:
            prepared = prepared.select(image_index)  # (N, nh, P, dk) per layer
        inputs = captions[:, :steps]  # (N, T)
        x = self._embed(inputs, torch.arange(steps, device=captions.device))  # (N, T, d)
        weights = []
        for index, (block, keys, values) in enumerate(
            zip(self.blocks, prepared.keys, prepared.values, strict=True)
        ):
            x, w = block(x, keys, values, self._needs_weights(index))
            weights.append(w)
        logits = self.out(self.final_norm(x))  # (N, T, V)
        mask = (lengths - 1).unsqueeze(1) > torch.arange(steps, device=captions.device)  # (N, T)
        alphas = self._reported(weights) * mask.unsqueeze(-1)  # (N, T, P)
        return DecoderOutput(logits, alphas.to(logits.dtype), mask)
