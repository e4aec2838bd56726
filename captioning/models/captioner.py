"""The whole model: a CNN encoder and the attention decoder, with its vocabulary and configuration."""

from __future__ import annotations

import itertools

import torch
from torch import Tensor, nn

from captioning.config import DecoderConfig, ModelConfig
from captioning.data.feature_cache import cache_batch_size
from captioning.data.vocab import Vocabulary
from captioning.models import decoder as _lstm  # noqa: F401 - registers the lstm decoder
from captioning.models import transformer as _transformer  # noqa: F401 - registers the transformer decoder
from captioning.models.base import CaptionDecoder, DecoderOutput, decoder_class
from captioning.models.encoders import Encoder, build_encoder, encoder_builder


def build_decoder(
    config: DecoderConfig, vocab_size: int, annotation_dim: int, grid: tuple[int, int]
) -> CaptionDecoder:
    """The decoder family ``config.kind`` names (``DECODERS``), for V words and a (gh, gw) grid of
    C-channel annotations."""
    return decoder_class(config.kind).from_config(config, vocab_size, annotation_dim, grid)


def check_model_config(config: ModelConfig) -> None:
    """Every registered name ``config`` chooses (encoder, decoder family and what the family names,
    e.g. its attention scorer), looked up before any work.

    Raises:
        ValueError: one line naming the key and the registered names (``UnknownNameError``, or the
            encoder registry's ``ConfigError``).
    """
    encoder_builder(config.encoder.name)
    decoder_class(config.decoder.kind).check_config(config.decoder)


class Captioner(nn.Module):
    """Encoder + decoder. Either images go through the encoder, or cached grids skip it.

    Args:
        encoder: the CNN; it reports ``channels`` and ``grid``.
        decoder: a ``CaptionDecoder`` (attention LSTM or Transformer), built for ``encoder.channels``.
        vocab: the word list the decoder's ids refer to.
        config: the model configuration the parts were built from (saved in checkpoints).
    """

    def __init__(self, encoder: Encoder, decoder: CaptionDecoder, vocab: Vocabulary, config: ModelConfig):
        super().__init__()
        if decoder.annotation_dim != encoder.channels:
            raise ValueError(
                f"decoder expects {decoder.annotation_dim} channels, encoder gives {encoder.channels}"
            )
        if decoder.vocab_size != len(vocab):
            raise ValueError(f"decoder has {decoder.vocab_size} words, vocabulary {len(vocab)}")
        self.encoder = encoder
        self.decoder = decoder
        self.vocab = vocab
        self.config = config
        # (weights key, encoder.inference_copy()): a plain tuple, so neither a submodule nor saved
        self._frozen_encoder: tuple[tuple, nn.Module] | None = None

    @classmethod
    def build(cls, config: ModelConfig, vocab: Vocabulary) -> Captioner:
        """Build the encoder (with its weights) and a fresh decoder for ``vocab``."""
        encoder = build_encoder(config.encoder)
        decoder = build_decoder(config.decoder, len(vocab), encoder.channels, encoder.grid)
        return cls(encoder, decoder, vocab, config)

    @property
    def grid(self) -> tuple[int, int]:
        return self.encoder.grid

    def encode(self, images: Tensor) -> Tensor:
        """(B, 3, S, S) normalised images -> (B, P, C) annotation grid.

        Without gradients and with the encoder in eval mode (captioning, validation, evaluation) the
        images go through :meth:`inference_encoder` in passes of ``cache_batch_size`` images: the
        features the feature cache stores, within float rounding, faster. Otherwise (training)
        through ``encoder`` itself.
        """
        if torch.is_grad_enabled() or self.encoder.training:
            return self.encoder(images)
        network = self.inference_encoder()
        step = cache_batch_size(images.device)
        if images.size(0) <= step:
            return network(images)
        return torch.cat([network(chunk) for chunk in images.split(step)])

    def inference_encoder(self) -> nn.Module:
        """``encoder.inference_copy()`` (eval mode, batch norms folded, channels-last), made once and
        kept while the encoder's weights, buffers and device stay as they are: a weight changed in
        place (an optimiser step, ``load_state_dict``) or a move makes a new copy on the next call.

        On 2 CPU cores ResNet-101 at 224 px encoded about 10 images/s this way in passes of 8 against
        about 7.7 through the encoder itself in one pass of 64 (benchmarks/README.md, "Captioning a
        folder").
        """
        tensors = itertools.chain(self.encoder.parameters(), self.encoder.buffers())
        key = tuple((id(t), t._version, t.device) for t in tensors)
        if self._frozen_encoder is None or self._frozen_encoder[0] != key:
            self._frozen_encoder = None  # the old copy freed before the new one is made
            self._frozen_encoder = (key, self.encoder.inference_copy())
        return self._frozen_encoder[1]

    def forward(
        self, annotations: Tensor, captions: Tensor, lengths: Tensor, image_index: Tensor | None = None
    ) -> DecoderOutput:
        """Teacher-forced decoding from annotation grids (see the decoder's ``forward``)."""
        return self.decoder(annotations, captions, lengths, image_index)
