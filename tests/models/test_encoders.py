"""Encoders: registry shapes, stage freezing, weights errors, fingerprints, and real Lite0 weights."""

from __future__ import annotations

import functools
import hashlib
import time
import urllib.error
from pathlib import Path

import pytest
import torch
from messages import raises_naming
from PIL import Image
from torch import nn

from captioning.config import ConfigError, EncoderConfig
from captioning.models import encoders
from captioning.models.encoders import ENCODERS, Encoder, EncoderWeightsError, build_encoder, encoder_builder

# The larger variants of a family are checked on the meta device only (shapes, no arithmetic).
LARGE = {"vit_l_16", "swin_b", "swin_v2_b", "convnext_base"}
# One model of each library family, small ones: every contract test runs on them too.
FAMILY_EXAMPLES = ["timm:vit_tiny_patch16_224", "timm:resnet18", "open_clip:ViT-B-32/openai"]
CONTRACT = sorted(set(ENCODERS) - LARGE) + FAMILY_EXAMPLES


@functools.cache
def _random_backbone(name: str, image_size: int = 64) -> encoders.Backbone:
    """One randomly initialised backbone per name for the whole session (VGG takes seconds to build)."""
    return encoder_builder(name)("none", image_size)


@pytest.mark.slow
@pytest.mark.parametrize("grid_size", [0, 2])
@pytest.mark.parametrize("name", CONTRACT)
def test_reported_shapes_match_output(name: str, grid_size: int) -> None:
    encoder = Encoder(name, _random_backbone(name), image_size=64, grid_size=grid_size).eval()
    with torch.inference_mode():
        grid_features = encoder(torch.randn(2, 3, 64, 64))
    assert grid_features.shape == (2, encoder.grid[0] * encoder.grid[1], encoder.channels)
    assert torch.isfinite(grid_features).all()
    if grid_size:
        assert encoder.grid == (2, 2)
    else:
        assert encoder.grid == encoder.native_grid


@pytest.mark.parametrize("name", ["vgg16", "vgg19"])
def test_vgg_is_cut_at_the_last_conv_before_the_final_pool(name: str) -> None:
    encoder = Encoder(name, _random_backbone(name), image_size=224, grid_size=0)
    assert (encoder.channels, encoder.grid) == (512, (14, 14))
    layers = list(encoder.backbone.modules())
    convs = [m for m in layers if isinstance(m, nn.Conv2d)]
    assert len(convs) == {"vgg16": 13, "vgg19": 16}[name]
    assert isinstance(layers[-1], nn.ReLU) and convs[-1].out_channels == 512
    assert sum(isinstance(m, nn.MaxPool2d) for m in layers) == 4
    # The real forward pass on shapes only (meta tensors cost no arithmetic).
    assert encoder(torch.empty(1, 3, 224, 224, device="meta")).shape == (1, 196, 512)


def test_resnet_native_grid_is_stride_32() -> None:
    encoder = Encoder("resnet50", _random_backbone("resnet50"), image_size=224, grid_size=0)
    assert (encoder.channels, encoder.grid) == (2048, (7, 7))
    assert [type(s).__name__ for s in encoder.stages()] == ["Sequential"] * 5


def _batch_norms(module: nn.Module) -> list[nn.BatchNorm2d]:
    return [m for m in module.modules() if isinstance(m, nn.BatchNorm2d)]


@pytest.mark.slow
def test_set_trainable_unfreezes_last_stages_and_keeps_frozen_batchnorm_in_eval() -> None:
    encoder = build_encoder(
        EncoderConfig(name="resnet50", weights="none", image_size=64, grid_size=2, fine_tune_stages=2)
    )
    stages = encoder.stages()
    frozen, trainable = stages[:3], stages[3:]
    assert all(p.requires_grad for stage in trainable for p in stage.parameters())
    assert not any(p.requires_grad for stage in frozen for p in stage.parameters())
    assert sum(p.numel() for p in encoder.parameters() if p.requires_grad) == sum(
        p.numel() for stage in trainable for p in stage.parameters()
    )

    encoder.train()
    assert encoder.training and all(m.training for stage in trainable for m in _batch_norms(stage))
    assert not any(m.training for stage in frozen for m in _batch_norms(stage))
    # Frozen running statistics stay fixed through a training-mode forward pass.
    before = stages[1][0].bn1.running_mean.clone()
    encoder(torch.randn(2, 3, 64, 64)).sum().backward()
    assert torch.equal(stages[1][0].bn1.running_mean, before)
    assert stages[4][0].conv1.weight.grad is not None and stages[0][0].weight.grad is None

    encoder.set_trainable(0)
    encoder.train()
    assert not any(p.requires_grad for p in encoder.parameters())
    assert not any(m.training for m in _batch_norms(encoder))
    encoder.eval()
    assert not any(m.training for m in encoder.modules())


def test_too_many_fine_tune_stages_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="fine_tune_stages"):
        build_encoder(EncoderConfig(name="efficientnet_lite0", weights="none", fine_tune_stages=10))


def test_unknown_name_lists_the_registry() -> None:
    with pytest.raises(ConfigError, match="resnet101"):
        build_encoder(EncoderConfig(name="alexnet", weights="none"))


def test_missing_local_weights_file(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.pth"
    with raises_naming(EncoderWeightsError, missing, "model.encoder.weights"):
        build_encoder(EncoderConfig(name="efficientnet_lite0", weights=str(missing)))


def test_local_weights_with_wrong_keys_names_them(tmp_path: Path) -> None:
    state = ENCODERS["efficientnet_lite0"]("none").features.state_dict()
    state.pop("_fc.bias")
    state["extra.weight"] = torch.zeros(1)
    path = tmp_path / "lite0.pth"
    torch.save(state, path)
    with raises_naming(EncoderWeightsError, path, "_fc.bias", "extra.weight"):
        build_encoder(EncoderConfig(name="efficientnet_lite0", weights=str(path)))


def test_local_weights_file_round_trips(tmp_path: Path) -> None:
    source = ENCODERS["efficientnet_lite0"]("none").features
    path = tmp_path / "lite0.pth"
    torch.save(source.state_dict(), path)
    encoder = build_encoder(EncoderConfig(name="efficientnet_lite0", weights=str(path), image_size=64))
    assert torch.equal(encoder.backbone._conv_stem.weight, source._conv_stem.weight)
    assert encoder.fingerprint()["weights"] == {
        "size": path.stat().st_size,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }


def test_offline_pretrained_raises_quickly_naming_file_url_and_place(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))

    def offline(url: str, *args, **kwargs) -> None:
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(torch.hub, "download_url_to_file", offline)
    started = time.monotonic()
    with pytest.raises(EncoderWeightsError) as caught:
        build_encoder(EncoderConfig(name="resnet101", weights="pretrained"))
    assert time.monotonic() - started < 10
    message = str(caught.value)
    expected_path = tmp_path / "hub" / "checkpoints" / "resnet101-cd907fc2.pth"
    assert "\n" not in message
    assert "https://download.pytorch.org/models/resnet101-cd907fc2.pth" in message
    assert str(expected_path) in message and "name resolution" in message


def test_pretrained_file_in_hub_cache_is_used_without_download(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path))

    def no_network(*args, **kwargs) -> None:
        raise AssertionError("must not download a cached file")

    monkeypatch.setattr(torch.hub, "download_url_to_file", no_network)
    import torchvision.models as tvm

    published = tvm.EfficientNet_B0_Weights.IMAGENET1K_V1
    reference = tvm.efficientnet_b0()
    (tmp_path / "checkpoints").mkdir()
    torch.save(reference.state_dict(), tmp_path / "checkpoints" / published.url.rsplit("/", 1)[-1])
    encoder = build_encoder(EncoderConfig(name="efficientnet_b0", weights="pretrained", image_size=64))
    assert torch.equal(encoder.backbone[0][0].weight, reference.features[0][0].weight)
    assert encoder.fingerprint()["weights"] == {"torchvision": "EfficientNet_B0_Weights.IMAGENET1K_V1"}
    assert encoder.mean == tuple(published.transforms().mean)


def test_fingerprint_changes_with_weights_grid_and_image_size() -> None:
    backbone = _random_backbone("efficientnet_lite0")
    base = Encoder("efficientnet_lite0", backbone, 64, 2).fingerprint()
    assert Encoder("efficientnet_lite0", backbone, 64, 2).fingerprint() == base
    assert Encoder("efficientnet_lite0", backbone, 64, 1).fingerprint() != base
    # The native grid at 64 px is 2x2: grid_size 0 gives the same features, so the same key.
    assert Encoder("efficientnet_lite0", backbone, 64, 0).fingerprint() == base
    assert Encoder("efficientnet_lite0", backbone, 96, 2).fingerprint() != base
    pretrained = build_encoder(
        EncoderConfig(name="efficientnet_lite0", weights="pretrained", image_size=64, grid_size=2)
    )
    assert pretrained.fingerprint() != base
    assert len(pretrained.fingerprint()["weights"]["sha256"]) == 64


def test_a_moved_weights_file_keeps_its_fingerprint(tmp_path: Path) -> None:
    # The same bytes give the same features: the feature cache must survive a copy or a reinstall.
    from captioning.models import efficientnet_lite

    original = efficientnet_lite.lite0_weights_file()
    copy = tmp_path / "elsewhere" / "lite0.pth"
    copy.parent.mkdir()
    copy.write_bytes(original.read_bytes())

    def fingerprint(weights: str) -> dict:
        return build_encoder(
            EncoderConfig(name="efficientnet_lite0", weights=weights, image_size=64, grid_size=0)
        ).fingerprint()

    assert fingerprint(str(copy)) == fingerprint("pretrained")
    changed = tmp_path / "changed.pth"
    content = bytearray(original.read_bytes())
    content[len(content) // 2] ^= 1  # one bit: other weights, another cache
    changed.write_bytes(bytes(content))
    assert encoders.file_identity(changed) != encoders.file_identity(original)


def test_transform_resizes_to_a_square_without_cropping() -> None:
    encoder = Encoder("efficientnet_lite0", _random_backbone("efficientnet_lite0"), 64, 2)
    # Left half black, right half white: a centre crop would lose the sides, a resize keeps both.
    image = Image.new("RGB", (200, 100), (0, 0, 0))
    image.paste((255, 255, 255), (100, 0, 200, 100))
    tensor = encoder.transform(image)
    assert tensor.shape == (3, 64, 64)
    black, white = (0 - 127 / 255) / (128 / 255), (1 - 127 / 255) / (128 / 255)
    assert tensor[:, :, :30].allclose(torch.tensor(black), atol=1e-3)
    assert tensor[:, :, 34:].allclose(torch.tensor(white), atol=1e-3)


@pytest.fixture(scope="module")
def lite0() -> Encoder:
    return build_encoder(
        EncoderConfig(name="efficientnet_lite0", weights="pretrained", image_size=224, grid_size=0)
    ).eval()


def test_lite0_native_grid(lite0: Encoder) -> None:
    assert (lite0.channels, lite0.grid) == (1280, (7, 7))


def test_lite0_pretrained_weights_classify_real_photos(lite0: Encoder) -> None:
    skimage_data = pytest.importorskip("skimage.data")
    images = torch.stack(
        [
            lite0.transform(Image.fromarray(skimage_data.chelsea())),
            lite0.transform(Image.fromarray(skimage_data.coffee())),
        ]
    )
    with torch.inference_mode():
        probabilities = lite0.backbone.classify(images).softmax(-1)  # (2, 1000)
        grid_features = lite0(images)
    cat, coffee = probabilities.argmax(-1).tolist()
    assert 281 <= cat <= 285  # tabby, tiger cat, Persian, Siamese, Egyptian cat (observed: 285, p 0.79)
    assert coffee in (967, 968)  # espresso, cup (observed: 967, p 0.90)
    assert probabilities.max(-1).values.min() > 0.5
    assert grid_features.shape == (2, 49, 1280) and torch.isfinite(grid_features).all()


def test_frozen_stages_compute_in_training_mode_what_they_compute_at_test_time():
    # EfficientNet drops residual branches at random in training mode (stochastic depth): a frozen
    # stage must not, or training features differ from validation and test features.
    torch.manual_seed(0)
    images = torch.randn(2, 3, 64, 64)
    frozen = build_encoder(
        EncoderConfig(name="efficientnet_lite0", weights="none", image_size=64, grid_size=0)
    )
    with torch.no_grad():
        expected = frozen.eval()(images)
        frozen.train()
        torch.testing.assert_close(frozen(images), expected)
        torch.testing.assert_close(frozen(images), expected)
    tuned = build_encoder(
        EncoderConfig(
            name="efficientnet_lite0", weights="none", image_size=64, grid_size=0, fine_tune_stages=2
        )
    ).train()
    layers = [[m for m in stage.modules() if not isinstance(m, nn.ModuleList)] for stage in tuned.stages()]
    assert not any(m.training for stage in layers[:-2] for m in stage)
    assert all(m.training for stage in layers[-2:] for m in stage)


def test_random_weights_are_told_apart_by_the_cache_key():
    def fingerprint(seed: int) -> dict:
        torch.manual_seed(seed)
        return build_encoder(
            EncoderConfig(name="efficientnet_lite0", weights="none", image_size=64, grid_size=0)
        ).fingerprint()

    assert fingerprint(1) == fingerprint(1)
    assert fingerprint(1) != fingerprint(2)


def test_a_grid_finer_than_the_native_one_is_refused():
    # the key and its value, the encoder and its grid, the keys that fix it
    with raises_naming(ConfigError, "model.encoder.grid_size 14", "efficientnet_lite0", "7x7", "image_size"):
        build_encoder(EncoderConfig(name="efficientnet_lite0", weights="none", image_size=224, grid_size=14))


# The registered networks with batch norms (the inference copy folds them; the others have none).
WITH_BATCH_NORMS = {
    "efficientnet_lite0",
    "resnet50",
    "resnet101",
    "resnet152",
    "efficientnet_b0",
    "timm:resnet18",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", CONTRACT)
def test_the_inference_copy_folds_every_batch_norm_and_computes_the_same_features(name: str) -> None:
    # Networks without batch norms (ViT, Swin, ConvNeXt, CLIP) are copied untraced: torch.fx cannot
    # trace torchvision's ViT, and there is nothing to fold.
    torch.manual_seed(0)
    encoder = Encoder(name, encoder_builder(name)("none", 64), image_size=64, grid_size=0)
    norms = [m for m in encoder.modules() if isinstance(m, nn.BatchNorm2d)]
    for norm in norms:  # statistics and affine terms far from the identity, so that a wrong fold shows
        norm.running_mean.uniform_(-1, 1)
        norm.running_var.uniform_(0.25, 4)
        norm.weight.data.uniform_(0.5, 1.5)
        norm.bias.data.uniform_(-0.5, 0.5)
    before = {key: value.clone() for key, value in encoder.state_dict().items()}
    images = torch.randn(2, 3, 64, 64)
    with torch.inference_mode():
        expected = encoder.eval()(images)
        encoder.train()
        frozen = encoder.inference_copy()
        features = frozen(images)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in frozen.modules())
    assert bool(norms) == (name in WITH_BATCH_NORMS)
    assert not frozen.training and not any(p.requires_grad for p in frozen.parameters())
    torch.testing.assert_close(features, expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())
    assert encoder.training and sum(isinstance(m, nn.BatchNorm2d) for m in encoder.modules()) == len(norms)
    assert all(torch.equal(value, before[key]) for key, value in encoder.state_dict().items())


@pytest.mark.slow
def test_the_folded_lite0_still_recognises_real_photos(lite0: Encoder) -> None:
    skimage_data = pytest.importorskip("skimage.data")
    images = torch.stack(
        [
            lite0.transform(Image.fromarray(skimage_data.chelsea())),
            lite0.transform(Image.fromarray(skimage_data.coffee())),
        ]
    )
    frozen = lite0.inference_copy()
    with torch.inference_mode():
        expected, features = lite0(images), frozen(images)
        classes = frozen.backbone.classify(images).argmax(-1).tolist()
    torch.testing.assert_close(features, expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())
    assert 281 <= classes[0] <= 285 and classes[1] in (967, 968)  # a cat; espresso or cup


def test_folding_needs_eval_mode() -> None:
    from captioning.models import efficientnet_lite

    with pytest.raises(ValueError, match="eval mode"):
        efficientnet_lite.fold_batch_norms(efficientnet_lite.efficientnet_lite0().train())
