"""The Transformer decoder's part of ``speed.py`` (``--parts transformer``): a training step and beam search.

For the 3+3-layer configuration of configs/coco_transformer.yaml and for 6+6 layers:

* a training step of 10 images x 5 captions (22 tokens, all full length) over 14x14x2048 grids:
  forward, ``caption_loss`` as the engine calls it for the Transformer (label smoothing 0.1, no
  penalty), backward, Adam (betas 0.9, 0.98); its FLOP counted from the layer sizes
  (``transformer_train_step_flop``) and the MFU over the matmul peak ``speed.py`` measured;
* batched ``beam_search`` of 16 images, 50 words, beam sizes 1, 3, 5 (``<end>`` unreachable),
  with the decoder's key/value caches and with ``RecomputingDecoder``, which recomputes the whole
  prefix at every step, driven by the same ``beam_search``.

``measure`` returns the numbers under the prefixes ``transformer_`` (3+3) and ``transformer6_``.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Any

import torch
from harness import PeakMemory, autocast, median_seconds
from recompute_baseline import RecomputingDecoder

from captioning.config import DecodeConfig, TransformerDecoderConfig
from captioning.data.vocab import Vocabulary
from captioning.models.decoding import beam_search
from captioning.models.transformer import TransformerDecoder
from captioning.training.losses import caption_loss
from captioning.training.optim import adam

LAYERS = {"transformer": 3, "transformer6": 6}  # key prefix: encoder and decoder blocks


@dataclass(frozen=True)
class TransformerSizes:
    """The Transformer benchmark's sizes; the defaults are the reference (configs/coco_transformer.yaml)."""

    images: int = 10  # train.batch_size of the COCO configuration
    captions_per_image: int = 5
    caption_tokens: int = 22  # <start> + 20 words + <end>: 21 decoding steps, every caption full length
    grid: int = 14  # P = 196 cells
    channels: int = 2048  # C (ResNet-101)
    vocab_size: int = 9490
    d_model: int = 512
    num_heads: int = 8
    d_ff: int = 2048
    dropout: float = 0.1
    label_smoothing: float = 0.1
    adam_beta2: float = 0.98
    beam_images: int = 16
    beam_max_length: int = 50
    beam_sizes: tuple[int, ...] = (1, 3, 5)

    @property
    def positions(self) -> int:
        return self.grid * self.grid

    def decoder_config(self, layers: int) -> TransformerDecoderConfig:
        """The COCO configuration's decoder with ``layers`` encoder and decoder blocks."""
        return TransformerDecoderConfig(
            d_model=self.d_model,
            num_heads=self.num_heads,
            d_ff=self.d_ff,
            encoder_layers=layers,
            decoder_layers=layers,
            pre_norm=False,
            tie_embeddings=True,
            dropout=self.dropout,
            doubly_stochastic=0.0,
        )


QUICK = TransformerSizes(
    images=2,
    captions_per_image=2,
    caption_tokens=6,
    grid=3,
    channels=32,
    vocab_size=50,
    d_model=16,
    num_heads=2,
    d_ff=32,
    beam_images=2,
    beam_max_length=5,
)


def transformer_train_step_flop(
    sizes: TransformerSizes, layers: int, num_images: int, num_captions: int, steps: int
) -> float:
    """FLOP of one teacher-forced step of the Transformer with ``layers`` + ``layers`` blocks.

    Matrix products only, a multiply-add is 2 FLOP, backward counted as twice the forward (x3 in
    all), as ``speed.train_step_flop``. Per image: the grid projection, every encoder block
    (q, k, v, out projections, scores and context over P x P, feed-forward) and every decoder
    block's cross-attention keys and values of the grid (once per image: the captions of an image
    share them through ``image_index``). Per caption of T steps and per decoder block: masked
    self-attention (projections and the T x T scores and context, counted dense), the
    cross-attention query and output projections and its T x P scores and context, the
    feed-forward; then the output layer over T steps. The embedding lookup is not a product.
    """
    p, c, d, f, v, t = sizes.positions, sizes.channels, sizes.d_model, sizes.d_ff, sizes.vocab_size, steps
    encoder_block = 2 * 4 * p * d * d + 2 * 2 * p * p * d + 2 * 2 * p * d * f
    per_image = 2 * p * c * d + layers * encoder_block + layers * 2 * 2 * p * d * d
    decoder_block = (
        2 * 4 * t * d * d
        + 2 * 2 * t * t * d  # masked self-attention
        + 2 * 2 * t * d * d
        + 2 * 2 * t * p * d  # cross-attention: query, output, scores, context
        + 2 * 2 * t * d * f
    )  # feed-forward
    per_caption = layers * decoder_block + 2 * t * d * v
    return 3.0 * (num_images * per_image + num_captions * per_caption)


def full_captions(
    sizes: TransformerSizes, num_captions: int, device: torch.device, generator: torch.Generator
) -> torch.Tensor:
    """(N, L) random captions ``<start> w.. <end>`` of ``caption_tokens`` tokens each."""
    captions = torch.randint(4, sizes.vocab_size, (num_captions, sizes.caption_tokens), generator=generator)
    captions[:, 0], captions[:, -1] = Vocabulary.start_id, Vocabulary.end_id
    return captions.to(device)


def train_step(
    decoder: TransformerDecoder,
    optimizer: torch.optim.Optimizer,
    annotations: torch.Tensor,
    captions: torch.Tensor,
    lengths: torch.Tensor,
    image_index: torch.Tensor,
    label_smoothing: float,
    device: torch.device,
    amp: bool,
) -> None:
    """Forward, ``caption_loss`` (no penalty, as the engine with doubly_stochastic 0), backward, Adam step."""
    optimizer.zero_grad(set_to_none=True)
    with autocast(device, amp):
        output = decoder(annotations, captions, lengths, image_index)
        loss = caption_loss(output, captions, 0.0, label_smoothing).total
    loss.backward()
    optimizer.step()


def training(
    sizes: TransformerSizes,
    decoder: TransformerDecoder,
    layers: int,
    device: torch.device,
    repeats: int,
    amp: bool,
) -> dict[str, float]:
    """Milliseconds, GFLOP and peak memory of one training step (images x captions_per_image captions)."""
    generator = torch.Generator().manual_seed(1)
    annotations = torch.rand(sizes.images, sizes.positions, sizes.channels, generator=generator).to(device)
    num_captions = sizes.images * sizes.captions_per_image
    captions = full_captions(sizes, num_captions, device, generator)
    lengths = torch.full((num_captions,), sizes.caption_tokens, device=device)
    image_index = torch.arange(sizes.images, device=device).repeat_interleave(sizes.captions_per_image)
    decoder.train()
    optimizer = adam(decoder.parameters(), lr=1e-4, betas=(0.9, sizes.adam_beta2))
    with PeakMemory(device) as memory:
        seconds = median_seconds(
            functools.partial(
                train_step,
                decoder,
                optimizer,
                annotations,
                captions,
                lengths,
                image_index,
                sizes.label_smoothing,
                device,
                amp,
            ),
            repeats,
            device,
        )
    gflop = (
        transformer_train_step_flop(sizes, layers, sizes.images, num_captions, sizes.caption_tokens - 1) / 1e9
    )
    return {
        "train_step_ms": seconds * 1e3,
        "train_step_gflop": gflop,
        "train_gflops": gflop / seconds,
        "train_peak_mem_mb": memory.mib,
    }


def beam_decoding(
    sizes: TransformerSizes,
    decoder: TransformerDecoder,
    device: torch.device,
    repeats: int,
    recompute_repeats: int,
    amp: bool,
) -> dict[str, Any]:
    """Captions per second of batched beam search with the key/value caches and with prefix recomputation.

    As for the LSTM in ``speed.py``, a copy of the weights gets ``<end>`` unreachable (output bias
    -1e4), so every search runs the full ``beam_max_length`` words; the tied output weight is the
    embedding, so only the bias is changed. Both sides decode the same grids with the same weights.
    """
    generator = torch.Generator().manual_seed(2)
    grids = torch.rand(sizes.beam_images, sizes.positions, sizes.channels, generator=generator).to(device)
    decoder = copy.deepcopy(decoder).eval()
    with torch.no_grad():
        decoder.out.bias[Vocabulary.end_id] = -1e4
    results: dict[str, Any] = {}
    for name, searched, runs in (
        ("beam", decoder, repeats),
        ("recompute_beam", RecomputingDecoder(decoder), recompute_repeats),
    ):
        rates = {}
        with PeakMemory(device) as memory:
            for k in sizes.beam_sizes:
                with autocast(device, amp):
                    seconds = median_seconds(
                        functools.partial(
                            beam_search,
                            searched,
                            grids,
                            DecodeConfig(beam_size=k, max_length=sizes.beam_max_length, forbid_unk=False),
                        ),
                        runs,
                        device,
                    )
                rates[str(k)] = sizes.beam_images / seconds
        results[f"{name}_captions_per_s"], results[f"{name}_peak_mem_mb"] = rates, memory.mib
    cached, recomputed = results["beam_captions_per_s"], results["recompute_beam_captions_per_s"]
    for k in sizes.beam_sizes:
        results[f"speedup_beam_{k}"] = cached[str(k)] / recomputed[str(k)]
    return results


def measure(
    sizes: TransformerSizes,
    device: torch.device,
    repeats: int,
    recompute_repeats: int,
    amp: bool,
    matmul_peak_gflops: float,
) -> dict[str, Any]:
    """Every Transformer number, keyed ``transformer_*`` (3+3 layers) and ``transformer6_*`` (6+6 layers).

    Args:
        matmul_peak_gflops: the ceiling the MFU is taken against (``speed.py``'s matmul peak).
    """
    results: dict[str, Any] = {}
    for prefix, layers in LAYERS.items():
        torch.manual_seed(0)
        decoder = TransformerDecoder.from_config(
            sizes.decoder_config(layers), sizes.vocab_size, sizes.channels, (sizes.grid, sizes.grid)
        ).to(device)
        numbers = training(sizes, decoder, layers, device, repeats, amp)
        numbers["train_mfu"] = numbers["train_gflops"] / matmul_peak_gflops
        numbers.update(beam_decoding(sizes, decoder, device, repeats, recompute_repeats, amp))
        results.update({f"{prefix}_{key}": value for key, value in numbers.items()})
    return results
