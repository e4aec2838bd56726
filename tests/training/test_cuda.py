"""On a GPU: mixed-precision training steps follow float32, the compiled step equals eager, and beam
search gives the CPU's captions. Marked ``cuda`` (``pytest -m cuda``); skipped without CUDA.

``python benchmarks/gpu_check.py`` runs these with the GPU benchmarks in one call.
"""

from __future__ import annotations

import copy

import pytest
import torch
from search_options import settings

from captioning.config import LSTMDecoderConfig
from captioning.data.vocab import Vocabulary
from captioning.models.decoder import ShowAttendTellDecoder
from captioning.models.decoding import beam_search
from captioning.training.losses import caption_loss
from captioning.utils.device import autocast

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

VOCAB, CHANNELS, POSITIONS = 300, 256, 49
# Relative distance from the float32 loss and gradient of one step. bf16 keeps 8 mantissa bits
# (rounding 0.4 % per product), fp16 11 bits (0.05 %); sums over many products partly cancel.
LOSS_TOLERANCE = {"bf16": 0.02, "fp16": 0.005}
GRADIENT_TOLERANCE = {"bf16": 0.05, "fp16": 0.01}  # |g - g32| / |g32| over all parameters


def _decoder(seed: int = 0) -> ShowAttendTellDecoder:
    torch.manual_seed(seed)
    config = LSTMDecoderConfig(embed_dim=128, hidden_dim=256, attention_dim=128, dropout=0.0)
    return ShowAttendTellDecoder.from_config(config, VOCAB, CHANNELS)


def _batch(device: torch.device, images: int = 8, per_image: int = 5, tokens: int = 14):
    generator = torch.Generator().manual_seed(1)
    annotations = torch.rand(images, POSITIONS, CHANNELS, generator=generator)  # (B, P, C)
    captions = torch.randint(4, VOCAB, (images * per_image, tokens), generator=generator)
    lengths = torch.randint(6, tokens + 1, (images * per_image,), generator=generator)
    for row, length in enumerate(lengths.tolist()):
        captions[row, 0], captions[row, length - 1] = Vocabulary.start_id, Vocabulary.end_id
        captions[row, length:] = Vocabulary.pad_id
    image_index = torch.arange(images).repeat_interleave(per_image)
    return [t.to(device) for t in (annotations, captions, lengths, image_index)]


def _loss_and_gradient(decoder: ShowAttendTellDecoder, batch, amp: str) -> tuple[float, torch.Tensor]:
    annotations, captions, lengths, image_index = batch
    decoder.zero_grad(set_to_none=True)
    with autocast(annotations.device, amp):
        loss = caption_loss(decoder(annotations, captions, lengths, image_index), captions, 1.0).total
    loss.backward()
    return float(loss.detach()), torch.cat([p.grad.float().flatten() for p in decoder.parameters()])


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_mixed_precision_training_step_follows_float32(amp):
    device = torch.device("cuda")
    decoder = _decoder().to(device).train()
    batch = _batch(device)
    loss32, gradient32 = _loss_and_gradient(decoder, batch, "none")
    loss, gradient = _loss_and_gradient(decoder, batch, amp)
    assert loss != loss32  # autocast was on
    assert abs(loss - loss32) <= LOSS_TOLERANCE[amp] * abs(loss32), (loss, loss32)
    distance = float((gradient - gradient32).norm() / gradient32.norm())
    assert distance <= GRADIENT_TOLERANCE[amp], distance


def test_compiled_step_equals_eager():
    device = torch.device("cuda")
    eager = _decoder().to(device).train()
    compiled = copy.deepcopy(eager)
    compiled.compile_step()
    batch = _batch(device)
    loss, gradient = _loss_and_gradient(eager, batch, "none")
    compiled_loss, compiled_gradient = _loss_and_gradient(compiled, batch, "none")
    assert abs(compiled_loss - loss) <= 1e-5 * abs(loss)
    torch.testing.assert_close(compiled_gradient, gradient, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_gpu_beam_search_gives_the_cpu_captions(beam_size):
    decoder = _decoder(2).eval()
    annotations = _batch(torch.device("cpu"))[0]
    with torch.inference_mode():
        on_cpu = beam_search(decoder, annotations, settings(beam_size=beam_size, max_length=16))
        on_gpu = beam_search(
            copy.deepcopy(decoder).cuda(), annotations.cuda(), settings(beam_size=beam_size, max_length=16)
        )
    assert [c.tokens for c in on_gpu] == [c.tokens for c in on_cpu]
    for gpu, cpu in zip(on_gpu, on_cpu, strict=True):
        assert abs(gpu.log_prob - cpu.log_prob) <= 1e-4 * abs(cpu.log_prob) + 1e-5
        torch.testing.assert_close(gpu.attention, cpu.attention, rtol=1e-4, atol=1e-5)
