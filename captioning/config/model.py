"""The ``model`` section: the encoder's options, what every caption decoder has (``DecoderConfig``),
the registry of decoder families' options classes (``DECODERS``) and the built-in families' own
options (the Show, Attend and Tell LSTM and the Transformer)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from captioning.config.fields import NameOrFile, check, check_family, check_types, one_of
from captioning.registry import FamilyRegistry

__all__ = [
    "DECODERS",
    "MAX_DECODER_SIZE",
    "MAX_IMAGE_SIZE",
    "DecoderConfig",
    "EncoderConfig",
    "LSTMDecoderConfig",
    "ModelConfig",
    "TransformerDecoderConfig",
]

# Upper bounds on the sizes a configuration (a user's, a checkpoint's or a model folder's) may ask for,
# checked before any tensor is allocated: far above any published captioning model (widths of 512 to
# 2048, images of 224 to 576 pixels), far below a size whose allocation fails or overflows.
MAX_DECODER_SIZE = 16384  # embedding, hidden, attention and feed-forward widths, heads and layers
MAX_IMAGE_SIZE = 4096  # model.encoder.image_size in pixels


@dataclass(frozen=True)
class EncoderConfig:
    """The CNN that turns an image into a grid of annotation vectors."""

    name: str = "efficientnet_lite0"  # a name from captioning.models.encoders.ENCODERS
    weights: NameOrFile = "pretrained"  # pretrained | none | path to a state-dict file
    image_size: int = 224  # images resized to a square of this side, no crop (the grid covers the image)
    grid_size: int = 0  # 0 keeps the native grid; else adaptive pooling to grid_size x grid_size
    fine_tune_stages: int = 0  # last N stages trained; 0 = frozen (features can be cached)

    def __post_init__(self) -> None:
        check_types(self, "model.encoder.")
        check(
            32 <= self.image_size <= MAX_IMAGE_SIZE,
            f"model.encoder.image_size must be in [32, {MAX_IMAGE_SIZE}], got {self.image_size}",
        )
        check(self.grid_size >= 0, f"model.encoder.grid_size must be >= 0, got {self.grid_size}")
        check(self.fine_tune_stages >= 0, "model.encoder.fine_tune_stages must be >= 0")


@dataclass(frozen=True)
class DecoderConfig:
    """What every caption decoder has; each family (a registered ``kind``) adds its own options."""

    kind: str = "lstm"  # a registered decoder: lstm (Show, Attend and Tell) | transformer
    dropout: float = 0.5  # LSTM: before the output layer; Transformer: embeddings and every residual branch
    doubly_stochastic: float = 1.0  # lambda of equation 14, both terms per caption (docs/training.md)

    def __post_init__(self) -> None:
        check_types(self, "model.decoder.")
        check_family(self, DECODERS)
        check(0.0 <= self.dropout < 1.0, f"model.decoder.dropout must be in [0, 1), got {self.dropout}")
        check(
            math.isfinite(self.doubly_stochastic) and self.doubly_stochastic >= 0,
            f"model.decoder.doubly_stochastic must be finite and >= 0, got {self.doubly_stochastic}",
        )

    def _positive(self, *names: str) -> None:
        """Each size at least 1 and at most MAX_DECODER_SIZE (the model is then built in memory)."""
        for name in names:
            value = getattr(self, name)
            check(
                1 <= value <= MAX_DECODER_SIZE,
                f"model.decoder.{name} must be in [1, {MAX_DECODER_SIZE}], got {value}",
            )


# The decoder families: model.decoder.kind -> its configuration class, and the decoder class attached
# when the models package registers it (``captioning.models.base.register_decoder``, which a decoder
# of your own uses too: docs/extending.md). The built-in families' options are registered here, where
# configurations are read.
DECODERS: FamilyRegistry[DecoderConfig] = FamilyRegistry(
    "decoder", key="model.decoder.kind", base=DecoderConfig
)


@DECODERS.register_options("lstm")
@dataclass(frozen=True)
class LSTMDecoderConfig(DecoderConfig):
    """The attention LSTM of Show, Attend and Tell (soft or hard attention)."""

    kind: str = "lstm"
    attention: str = "soft"  # soft (section 4.2) | hard (stochastic, section 4.1)
    scoring: str = "additive"  # a registered attention scorer (captioning.models.attention.SCORERS)
    activation: str = "tanh"  # additive scoring non-linearity: tanh (paper) | relu (tutorial)
    num_heads: int = 8  # heads of the multihead scorer
    embed_dim: int = 512  # word embedding size
    hidden_dim: int = 512  # LSTM size
    attention_dim: int = 512  # attention projection size
    gate: str = "scalar"  # scalar (paper's beta_t) | channel (tutorial) | none
    deep_output: bool = True  # equation 7; False gives a plain linear output over h_t
    init_layers: int = 1  # layers of the h_0/c_0 MLP; 2 as the authors' COCO script (C->C ReLU)
    output_tanh: bool = False  # tanh over equation 7's sum before the output layer (authors' code)
    hidden_dropout: bool = False  # dropout on h_t before L_h too (authors' code; deep output only)
    annotation_layers: int = 1  # additive scoring: 2 adds an A->A tanh layer (authors' n_layers_att=2)
    # Hard attention (equation 12: REINFORCE with a moving-average baseline and an entropy bonus).
    hard_reinforce: float = 1.0  # hard attention: lambda_r, weight of the REINFORCE term
    hard_entropy: float = 0.002  # hard attention: lambda_e, weight of the entropy bonus
    hard_baseline_decay: float = 0.9  # hard attention: decay of the moving-average reward baseline
    hard_expected_prob: float = 0.5  # hard attention: probability of the expected context instead of a sample
    # caption: each caption draws its own (the paper's semi-sampling); minibatch: one draw for the whole
    # minibatch, as capgen.py's h_sampling_mask (the authors' code); docs/training.md
    hard_expected_draw: str = "caption"  # hard attention: caption | minibatch (one draw per pass)
    # paper: every term's gradient reaches alpha_t (equation 12 plus equation 14's penalty); authors: only
    # REINFORCE's and the entropy's, as capgen.py's known_grads (no gradient from the penalty or through
    # the expected context); docs/training.md
    hard_alpha_gradients: str = "paper"  # hard attention: paper | authors (the penalty without gradient)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._positive(
            "embed_dim", "hidden_dim", "attention_dim", "num_heads", "init_layers", "annotation_layers"
        )
        check(
            self.annotation_layers == 1 or self.scoring == "additive",
            "model.decoder.annotation_layers > 1 needs model.decoder.scoring additive",
        )
        check(
            not self.hidden_dropout or self.deep_output,
            "model.decoder.hidden_dropout needs model.decoder.deep_output",
        )
        one_of("model.decoder.hard_alpha_gradients", self.hard_alpha_gradients, ("paper", "authors"))
        one_of("model.decoder.hard_expected_draw", self.hard_expected_draw, ("caption", "minibatch"))
        one_of("model.decoder.attention", self.attention, ("soft", "hard"))
        one_of("model.decoder.activation", self.activation, ("tanh", "relu"))
        one_of("model.decoder.gate", self.gate, ("scalar", "channel", "none"))
        check(
            not self.output_tanh or self.deep_output,
            "model.decoder.output_tanh needs model.decoder.deep_output",
        )
        for name in ("hard_reinforce", "hard_entropy"):
            value = getattr(self, name)
            check(
                math.isfinite(value) and value >= 0,
                f"model.decoder.{name} must be finite and >= 0, got {value}",
            )
        check(0.0 <= self.hard_expected_prob <= 1.0, "model.decoder.hard_expected_prob must be in [0, 1]")
        check(0.0 <= self.hard_baseline_decay < 1.0, "model.decoder.hard_baseline_decay must be in [0, 1)")


@DECODERS.register_options("transformer")
@dataclass(frozen=True)
class TransformerDecoderConfig(DecoderConfig):
    """The Transformer decoder over the same grid (docs/transformer.md)."""

    kind: str = "transformer"
    num_heads: int = 8  # attention heads of every block
    d_model: int = 512  # model width (embeddings, attention, residual stream)
    d_ff: int = 2048  # inner size of the feed-forward blocks
    encoder_layers: int = 3  # self-attention blocks over the grid, once per image; 0 = none
    decoder_layers: int = 3  # decoder blocks (self-attention, cross-attention, feed-forward)
    pre_norm: bool = False  # LayerNorm before each sublayer instead of after (the original)
    tie_embeddings: bool = True  # the output layer shares the word embedding matrix

    def __post_init__(self) -> None:
        super().__post_init__()
        self._positive("num_heads", "d_model", "d_ff", "decoder_layers")
        check(
            self.encoder_layers >= 0, f"model.decoder.encoder_layers must be >= 0, got {self.encoder_layers}"
        )
        check(
            self.d_model % self.num_heads == 0,
            f"model.decoder.d_model ({self.d_model}) must be divisible by model.decoder.num_heads "
            f"({self.num_heads})",
        )


@dataclass(frozen=True)
class ModelConfig:
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    decoder: DecoderConfig = field(default_factory=LSTMDecoderConfig)  # its class follows decoder.kind
