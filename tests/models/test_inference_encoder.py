"""``Captioner.encode`` without gradients: the encoder's folded inference copy, kept while the weights
stay, equal to the encoder itself; with gradients or in training mode, the encoder itself."""

from __future__ import annotations

import torch
from search_options import settings

from captioning.config import EncoderConfig, LSTMDecoderConfig, ModelConfig
from captioning.data.feature_cache import cache_batch_size
from captioning.data.vocab import SPECIALS, Vocabulary
from captioning.models.captioner import Captioner
from captioning.models.decoding import beam_search


def _captioner() -> Captioner:
    torch.manual_seed(0)
    config = ModelConfig(
        encoder=EncoderConfig(name="efficientnet_lite0", weights="pretrained", image_size=64),
        decoder=LSTMDecoderConfig(embed_dim=16, hidden_dim=16, attention_dim=16),
    )
    vocab = Vocabulary([*SPECIALS, "a", "red", "green", "square", "circle", "small", "large"])
    return Captioner.build(config, vocab).eval()


def _images(count: int) -> torch.Tensor:
    return torch.randn(count, 3, 64, 64, generator=torch.Generator().manual_seed(1))


def test_inference_encode_equals_the_encoder_across_passes():
    model = _captioner()
    images = _images(2 * cache_batch_size(torch.device("cpu")) + 3)  # three passes, the last short
    with torch.no_grad():
        plain = model.encoder(images)
    with torch.inference_mode():
        fast = model.encode(images)
    assert fast.shape == plain.shape
    torch.testing.assert_close(fast, plain, rtol=1e-4, atol=1e-4 * float(plain.abs().max()))
    assert model._frozen_encoder is not None
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.inference_encoder().modules())


def test_the_copy_is_kept_until_the_weights_change():
    model = _captioner()
    first = model.inference_encoder()
    assert model.inference_encoder() is first
    changed = {k: v + 0.01 if v.is_floating_point() else v for k, v in model.encoder.state_dict().items()}
    model.encoder.load_state_dict(changed)  # in place: the tensors' versions move
    second = model.inference_encoder()
    assert second is not first
    images = _images(2)
    with torch.inference_mode():
        torch.testing.assert_close(model.encode(images), model.encoder(images), rtol=1e-4, atol=1e-3)


def test_training_and_gradients_use_the_encoder_itself():
    model = _captioner()
    model.encoder.set_trainable(1)
    images = _images(2)
    assert model.encode(images).requires_grad  # gradients on: the trainable stage gets them
    model.train()
    with torch.no_grad():
        model.encode(images)
    assert model._frozen_encoder is None  # neither call made a copy
    assert not any("frozen" in key for key in model.state_dict())


def test_captions_from_the_copy_equal_those_from_the_encoder():
    model = _captioner()
    images = _images(5)
    with torch.inference_mode():
        fast = beam_search(model.decoder, model.encode(images), settings(beam_size=3, max_length=6))
        plain = beam_search(model.decoder, model.encoder(images), settings(beam_size=3, max_length=6))
    assert [c.tokens for c in fast] == [c.tokens for c in plain]
    for a, b in zip(fast, plain, strict=True):
        torch.testing.assert_close(a.attention, b.attention, rtol=1e-3, atol=1e-4)
        assert abs(a.log_prob - b.log_prob) < 1e-3
