"""Attention scoring functions over the annotation grid.

Every scorer works in two phases, so the work that depends only on the image is done once:

* ``prepare(annotations)`` projects the annotation vectors (keys and values) once per image,
  before the time loop (and before beams are expanded);
* ``forward(prepared, query)`` scores the projected keys against the decoder state h_{t-1} at
  each step and returns attention weights over the P grid positions.

``combine(weights, prepared)`` turns weights (soft attention) or one-hot locations (hard
attention) into the context vector z_t of size ``context_dim``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from captioning.config import ConfigError, LSTMDecoderConfig
from captioning.registry import Registry


class Prepared(NamedTuple):
    """Per-image projections, computed once; every field has the images on dim 0.

    ``group`` decoder rows share each image: the N = B * group queries are image-major (the K
    beams of image 0, then those of image 1, ...), and the scorers read an image's projections
    once for its whole group instead of from K copies (beam search, several samples per image).
    """

    keys: Tensor  # (B, P, A) or (B, nh, P, dk)
    values: Tensor  # (B, P, Dv) or (B, nh, P, dv)
    group: int = 1  # query rows per image

    @property
    def positions(self) -> int:
        """P, the grid positions attended over."""
        return self.keys.shape[-2]

    def select(self, index: Tensor) -> Prepared:
        """Rows ``index`` of every field, e.g. to give each caption its image's projections."""
        return self._replace(keys=self.keys.index_select(0, index), values=self.values.index_select(0, index))

    def head(self, n: int) -> Prepared:
        """The first ``n`` rows (a view), for an active batch that shrinks as captions end."""
        return self._replace(keys=self.keys[:n], values=self.values[:n])


class Attention(nn.Module):
    """Base class: subclasses define ``prepare`` and ``scores``; weights are a softmax over P."""

    context_dim: int
    num_heads: int = 1

    def prepare(self, annotations: Tensor) -> Prepared:
        raise NotImplementedError

    def scores(self, prepared: Prepared, query: Tensor) -> Tensor:
        """Unnormalised scores (N, nh, P) for decoder states ``query`` (N, H)."""
        raise NotImplementedError

    def forward(self, prepared: Prepared, query: Tensor) -> Tensor:
        """Attention weights (N, nh, P), each head's weights summing to 1 over positions."""
        return torch.softmax(self.scores(prepared, query), dim=-1)

    def combine(self, weights: Tensor, prepared: Prepared) -> Tensor:
        """Context (N, context_dim) from weights (N, nh, P) over the values."""
        values, group = prepared.values, prepared.group
        if values.dim() == 3:  # single head: values (B, P, D); a group's weights are the rows of one product
            # In the values' dtype, outside autocast: under bf16 autocast the product would cast the
            # whole (B, P, D) grid at every step, and on CPU a bf16 product with a few rows per image
            # runs slower than the float32 one.
            with torch.autocast(values.device.type, enabled=False):
                return torch.bmm(weights.view(-1, group, weights.size(-1)).to(values.dtype), values).flatten(
                    0, 1
                )
        heads = weights.view(-1, group, *weights.shape[1:]).transpose(1, 2)  # (B, nh, G, P)
        context = torch.matmul(heads, values).transpose(1, 2)  # (B, G, nh, dv)
        return context.flatten(2).flatten(0, 1)  # (N, nh*dv)


class AdditiveAttention(Attention):
    """The paper's f_att: e_ti = w^T act(W_a a_i + W_h h_{t-1}) (Bahdanau et al.), values = a_i.

    Args:
        annotation_dim: C, channels of the annotation vectors.
        hidden_dim: H, the decoder state size.
        attention_dim: A, the projection size.
        activation: ``tanh`` (paper) or ``relu`` (the popular tutorial).
        annotation_layers: layers over the annotations before W_h h is added: 1 (W_a a_i, the
            paper) or more, each extra one an A -> A linear layer and tanh (the authors' code,
            ``n_layers_att``; their COCO script uses 2).
    """

    def __init__(
        self,
        annotation_dim: int,
        hidden_dim: int,
        attention_dim: int,
        activation: str = "tanh",
        annotation_layers: int = 1,
    ):
        super().__init__()
        self.annotation_proj = nn.Linear(annotation_dim, attention_dim)
        # Extra layers of the authors' n_layers_att (none by default, so older weights load as before).
        self.annotation_layers = nn.Sequential(
            *[
                nn.Sequential(nn.Linear(attention_dim, attention_dim), nn.Tanh())
                for _ in range(annotation_layers - 1)
            ]
        )
        self.query_proj = nn.Linear(hidden_dim, attention_dim, bias=False)
        self.score = nn.Linear(attention_dim, 1, bias=False)  # a bias would cancel in the softmax
        # In place on the fresh (N, P, A) sum: one large temporary per step instead of two (autograd
        # allows it: the sum's backward does not need its output; tanh and relu save their result).
        self.activation: Callable[[Tensor], Tensor] = torch.tanh_ if activation == "tanh" else torch.relu_
        self.context_dim = annotation_dim

    def prepare(self, annotations: Tensor) -> Prepared:
        keys = self.annotation_layers(self.annotation_proj(annotations))  # (B, P, A)
        return Prepared(keys, annotations)  # (B, P, A), (B, P, C)

    def scores(self, prepared: Prepared, query: Tensor) -> Tensor:
        query = self.query_proj(query).view(
            -1, prepared.group, 1, self.query_proj.out_features
        )  # (B, G, 1, A)
        hidden = self.activation(prepared.keys.unsqueeze(1) + query)  # (B, G, P, A), in place
        return self.score(hidden.flatten(0, 1)).squeeze(-1).unsqueeze(1)  # (N, 1, P)


class GeneralAttention(Attention):
    """Luong's 'general' (bilinear) scoring: e_ti = a_i . W h_{t-1}; values = a_i.

    Registered as ``general``; configurations and checkpoints written before it had that name call
    it ``dot``: a checkpoint or model folder naming ``dot`` whose weights hold this scorer's ``query_proj``
    is read as ``general`` (``captioning.hub.checkpoint.checkpoint_config``).
    """

    def __init__(self, annotation_dim: int, hidden_dim: int):
        super().__init__()
        self.query_proj = nn.Linear(hidden_dim, annotation_dim, bias=False)
        self.context_dim = annotation_dim

    def prepare(self, annotations: Tensor) -> Prepared:
        return Prepared(annotations, annotations)  # (B, P, C), (B, P, C)

    def scores(self, prepared: Prepared, query: Tensor) -> Tensor:
        keys = prepared.keys  # (B, P, C)
        query = self.query_proj(query).view(-1, prepared.group, keys.size(-1)).transpose(1, 2)  # (B, C, G)
        return torch.bmm(keys, query).transpose(1, 2).reshape(-1, 1, keys.size(1))  # (N, 1, P)


class DotAttention(Attention):
    """Luong's 'dot' scoring, the plain dot product: e_ti = a_i . h_{t-1}, no weights; values = a_i.

    The decoder state and the annotation vectors must have one size (``hidden_dim`` = C).
    """

    def __init__(self, annotation_dim: int, hidden_dim: int):
        super().__init__()
        if annotation_dim != hidden_dim:
            raise ConfigError(
                f"model.decoder.scoring dot (a_i . h, no weights) needs model.decoder.hidden_dim equal to "
                f"the annotations' {annotation_dim} channels, got {hidden_dim}; scoring general "
                "(a_i . W h) takes any sizes"
            )
        self.context_dim = annotation_dim

    def prepare(self, annotations: Tensor) -> Prepared:
        return Prepared(annotations, annotations)  # (B, P, C), (B, P, C)

    def scores(self, prepared: Prepared, query: Tensor) -> Tensor:
        keys = prepared.keys  # (B, P, C)
        query = query.view(-1, prepared.group, keys.size(-1)).transpose(1, 2)  # (B, C, G)
        return torch.bmm(keys, query.to(keys.dtype)).transpose(1, 2).reshape(-1, 1, keys.size(1))  # (N, 1, P)


class CosineAttention(GeneralAttention):
    """Cosine similarity: e_ti = s cos(a_i, W h_{t-1}), s a learned scale (10 at first); values = a_i.

    Cosines lie in [-1, 1], whose softmax over P positions is nearly uniform: the scale lets the
    weights sharpen as training needs.
    """

    def __init__(self, annotation_dim: int, hidden_dim: int):
        super().__init__(annotation_dim, hidden_dim)
        self.log_scale = nn.Parameter(torch.tensor(math.log(10.0)))

    def prepare(self, annotations: Tensor) -> Prepared:
        return Prepared(F.normalize(annotations, dim=-1), annotations)  # unit keys (B, P, C), values

    def scores(self, prepared: Prepared, query: Tensor) -> Tensor:
        keys = prepared.keys  # (B, P, C), unit length
        query = F.normalize(self.query_proj(query), dim=-1)  # (N, C)
        query = query.view(-1, prepared.group, keys.size(-1)).transpose(1, 2)  # (B, C, G)
        cosines = torch.bmm(keys, query).transpose(1, 2).reshape(-1, 1, keys.size(1))  # (N, 1, P)
        return self.log_scale.exp() * cosines


class KeyValueProjection(nn.Linear):
    """Keys and values of the annotations in one product, the keys' half of the bias left out.

    A key bias adds b_k . q to every cell's score, which the softmax cancels: its gradient is zero up
    to rounding, and Adam turns that rounding into full-size updates (several processes then drift
    apart on it). Leaving it out changes no attention weight, so older checkpoints (which hold the
    full bias) keep their function.
    """

    def forward(self, x: Tensor) -> Tensor:
        half = self.out_features // 2
        return F.linear(x, self.weight, torch.cat([self.bias.new_zeros(half), self.bias[half:]]))


class ScaledDotAttention(Attention):
    """Scaled dot-product attention with query/key/value projections and ``num_heads`` heads.

    With one head: e_ti = (W_k a_i) . (W_q h) / sqrt(A), z = sum_i alpha_ti W_v a_i.
    With several heads the A-dimensional projections are split into heads (Vaswani et al.);
    the context is the concatenation of the heads followed by an output projection.
    """

    def __init__(self, annotation_dim: int, hidden_dim: int, attention_dim: int, num_heads: int = 1):
        super().__init__()
        if attention_dim % num_heads:
            raise ValueError(f"attention_dim {attention_dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = attention_dim // num_heads
        self.key_value_proj = KeyValueProjection(annotation_dim, 2 * attention_dim)
        self.query_proj = nn.Linear(hidden_dim, attention_dim)
        self.output_proj = nn.Linear(attention_dim, attention_dim) if num_heads > 1 else nn.Identity()
        self.context_dim = attention_dim

    def _split(self, x: Tensor) -> Tensor:
        n, p, _ = x.shape
        return x.view(n, p, self.num_heads, self.head_dim).transpose(1, 2)  # (B, nh, P, dk)

    def prepare(self, annotations: Tensor) -> Prepared:
        keys, values = self.key_value_proj(annotations).chunk(2, dim=-1)  # (B, P, A) each
        if self.num_heads == 1:
            return Prepared(keys, values)
        return Prepared(self._split(keys), self._split(values))

    def scores(self, prepared: Prepared, query: Tensor) -> Tensor:
        query = self.query_proj(query) / math.sqrt(self.head_dim)  # (N, A)
        keys, group = prepared.keys, prepared.group
        if self.num_heads == 1:
            query = query.view(-1, group, self.head_dim).transpose(1, 2)  # (B, dk, G)
            return torch.bmm(keys, query).transpose(1, 2).reshape(-1, 1, keys.size(1))  # (N, 1, P)
        query = query.view(-1, group, self.num_heads, self.head_dim).permute(0, 2, 3, 1)  # (B, nh, dk, G)
        return torch.matmul(keys, query).permute(0, 3, 1, 2).flatten(0, 1)  # (N, nh, P)

    def combine(self, weights: Tensor, prepared: Prepared) -> Tensor:
        return self.output_proj(super().combine(weights, prepared))  # (N, A)


# (annotation_dim C, hidden_dim H, the LSTM's configuration) -> the scorer, for queries h_{t-1} of size H.
ScorerBuilder = Callable[[int, int, LSTMDecoderConfig], Attention]

# model.decoder.scoring -> a thin builder reading the scorer's sizes from the configuration.
SCORERS: Registry[ScorerBuilder] = Registry("attention scorer", key="model.decoder.scoring")


@SCORERS.register("additive")
def additive(annotation_dim: int, hidden_dim: int, config: LSTMDecoderConfig) -> Attention:
    """Bahdanau's MLP scorer of the paper (``activation`` tanh; relu as the popular tutorial)."""
    return AdditiveAttention(
        annotation_dim, hidden_dim, config.attention_dim, config.activation, config.annotation_layers
    )


@SCORERS.register("general")
def general(annotation_dim: int, hidden_dim: int, config: LSTMDecoderConfig) -> Attention:
    """Luong's general (bilinear) scorer; the context is the annotation vector itself (size C)."""
    return GeneralAttention(annotation_dim, hidden_dim)


@SCORERS.register("dot")
def dot(annotation_dim: int, hidden_dim: int, config: LSTMDecoderConfig) -> Attention:
    """Luong's dot scorer, a_i . h without weights (``hidden_dim`` must equal C); context size C."""
    return DotAttention(annotation_dim, hidden_dim)


@SCORERS.register("cosine")
def cosine(annotation_dim: int, hidden_dim: int, config: LSTMDecoderConfig) -> Attention:
    """Scaled cosine similarity of a_i and W h; the context is the annotation vector itself (size C)."""
    return CosineAttention(annotation_dim, hidden_dim)


@SCORERS.register("scaled_dot")
def scaled_dot(annotation_dim: int, hidden_dim: int, config: LSTMDecoderConfig) -> Attention:
    """Scaled dot product over ``attention_dim`` projections, one head."""
    return ScaledDotAttention(annotation_dim, hidden_dim, config.attention_dim, 1)


@SCORERS.register("multihead")
def multihead(annotation_dim: int, hidden_dim: int, config: LSTMDecoderConfig) -> Attention:
    """Scaled dot product with ``num_heads`` heads of ``attention_dim / num_heads`` each."""
    if config.attention_dim % config.num_heads:
        raise ConfigError(
            f"model.decoder.attention_dim ({config.attention_dim}) must be divisible by "
            f"model.decoder.num_heads ({config.num_heads}) for scoring multihead"
        )
    return ScaledDotAttention(annotation_dim, hidden_dim, config.attention_dim, config.num_heads)


def build_attention(config: LSTMDecoderConfig, annotation_dim: int) -> Attention:
    """The scorer ``config.scoring`` names, for C-channel annotations and the LSTM's queries of
    ``config.hidden_dim``.

    Raises:
        UnknownNameError: ``config.scoring`` is not registered (the message lists the registered ones).
    """
    return SCORERS[config.scoring](annotation_dim, config.hidden_dim, config)
