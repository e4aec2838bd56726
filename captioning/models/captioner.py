"""The whole model: a CNN encoder and the attention decoder, with its vocabulary and configuration."""

from __future__ import annotations

from torch import Tensor, nn

from captioning.config import DecoderConfig, ModelConfig
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
        """(B, 3, S, S) normalised images -> (B, P, C) annotation grid."""
        return self.encoder(images)

    def forward(
        self, annotations: Tensor, captions: Tensor, lengths: Tensor, image_index: Tensor | None = None
    ) -> DecoderOutput:
        """Teacher-forced decoding from annotation grids (see the decoder's ``forward``)."""
        return self.decoder(annotations, captions, lengths, image_index)
