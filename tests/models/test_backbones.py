"""Today's backbones: ViT, Swin, ConvNeXt (torchvision), any timm model, CLIP towers (open_clip).

Their published grids, fine-tuning stages, preprocessing from the library, weights files loaded by
the library, offline errors, and a tiny Shapes run per family that trains, caches, decodes, draws
figures and scores grounding.
"""

from __future__ import annotations

import json
import time
import urllib.error
from pathlib import Path

import pytest
import torch
from messages import raises_naming
from test_training import as_flags, data_root, tiny_overrides  # noqa: F401 (data_root: a fixture)
from tool_runs import in_process

from captioning.config import ConfigError, EncoderConfig
from captioning.hub.checkpoint import load_checkpoint
from captioning.models.encoders import (
    ENCODERS,
    Encoder,
    EncoderWeightsError,
    build_encoder,
    encoder_builder,
    weights,
)

REPO = Path(__file__).resolve().parents[2]
timm = pytest.importorskip("timm")
open_clip = pytest.importorskip("open_clip")

# Channels and grid at the size each published model was trained at (their papers' and libraries' numbers).
PUBLISHED_GRIDS = {
    "vit_b_16": (224, 768, (14, 14)),
    "vit_l_16": (224, 1024, (14, 14)),
    "swin_t": (224, 768, (7, 7)),
    "swin_b": (224, 1024, (7, 7)),
    "swin_v2_b": (256, 1024, (8, 8)),
    "convnext_tiny": (224, 768, (7, 7)),
    "convnext_base": (224, 1024, (7, 7)),
    "timm:vit_base_patch16_clip_224.openai": (224, 768, (14, 14)),
    "timm:swin_base_patch4_window12_384": (384, 1024, (12, 12)),
    "timm:convnext_base.fb_in22k": (224, 1024, (7, 7)),
    "open_clip:ViT-B-32/openai": (224, 768, (7, 7)),
    "open_clip:ViT-B-16/openai": (224, 768, (14, 14)),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_GRIDS))
def test_each_backbone_reports_its_published_grid(name: str) -> None:
    # On the meta device: the real modules and forward pass, shapes only (no memory, no arithmetic).
    size, channels, grid = PUBLISHED_GRIDS[name]
    with torch.device("meta"):
        encoder = Encoder(name, encoder_builder(name)("none", size), image_size=size, grid_size=0)
    assert (encoder.channels, encoder.grid) == (channels, grid)
    assert encoder(torch.empty(1, 3, size, size, device="meta")).shape == (1, grid[0] * grid[1], channels)


def test_every_registered_name_has_a_published_grid() -> None:
    assert {"vit_b_16", "vit_l_16", "swin_t", "swin_b", "swin_v2_b", "convnext_tiny", "convnext_base"} <= set(
        ENCODERS
    )
    assert set(ENCODERS) - {
        "resnet50",
        "resnet101",
        "resnet152",
        "vgg16",
        "vgg19",
        "efficientnet_b0",
        "efficientnet_lite0",
    } <= set(PUBLISHED_GRIDS)


@pytest.mark.parametrize(
    "name", ["vit_b_16", "timm:vit_tiny_patch16_224", "open_clip:ViT-B-32/openai", "swin_t"]
)
def test_the_last_fine_tuned_stage_holds_the_final_norm(name: str) -> None:
    encoder = build_encoder(
        EncoderConfig(name=name, weights="none", image_size=64, grid_size=0, fine_tune_stages=1)
    )
    final_norm = [m for m in encoder.stages()[-1].modules() if isinstance(m, torch.nn.LayerNorm)][-1]
    assert all(p.requires_grad for p in final_norm.parameters())
    trainable = sum(p.numel() for p in encoder.parameters() if p.requires_grad)
    assert trainable == sum(p.numel() for p in encoder.stages()[-1].parameters())
    assert not any(p.requires_grad for p in encoder.stages()[0].parameters())
    encoder.train()
    assert encoder.stages()[-1].training and not encoder.stages()[0].training


@pytest.mark.slow
def test_preprocessing_comes_from_the_library() -> None:
    vit = build_encoder(
        EncoderConfig(name="timm:vit_tiny_patch16_224", weights="none", image_size=64, grid_size=0)
    )
    data = timm.data.resolve_data_config({}, model=timm.create_model("vit_tiny_patch16_224"))
    assert (vit.mean, vit.std, vit.interpolation.value) == (data["mean"], data["std"], data["interpolation"])
    assert vit.fingerprint()["position_embedding_size"] == 224 == data["input_size"][-1]
    clip = build_encoder(
        EncoderConfig(name="open_clip:ViT-B-32/openai", weights="none", image_size=64, grid_size=0)
    )
    tag = open_clip.get_pretrained_cfg("ViT-B-32", "openai")
    assert (clip.mean, clip.std, clip.interpolation.value) == (tag["mean"], tag["std"], tag["interpolation"])
    # CNN fingerprints keep the keys they had, so their feature caches stay valid.
    assert (
        "position_embedding_size"
        not in build_encoder(EncoderConfig(name="convnext_tiny", weights="none", image_size=64)).fingerprint()
    )


def test_a_timm_weights_file_goes_through_timm_with_its_position_embeddings_resampled(tmp_path: Path) -> None:
    source = timm.create_model("vit_tiny_patch16_224")  # the classifier at 224 px, as published
    path = tmp_path / "vit_tiny.pth"
    torch.save(source.state_dict(), path)
    encoder = build_encoder(
        EncoderConfig(name="timm:vit_tiny_patch16_224", weights=str(path), image_size=64, grid_size=0)
    )
    model = encoder.backbone.model
    assert torch.equal(model.blocks[3].mlp.fc1.weight, source.blocks[3].mlp.fc1.weight)
    assert model.pos_embed.shape == (1, 1 + 16, 192) and source.pos_embed.shape == (1, 1 + 196, 192)
    assert torch.equal(model.pos_embed[:, 0], source.pos_embed[:, 0])  # the class token's, kept
    assert encoder.fingerprint()["weights"]["size"] == path.stat().st_size


@pytest.mark.slow
def test_a_torchvision_vit_file_at_another_size_gets_interpolated_position_embeddings(tmp_path: Path) -> None:
    import torchvision.models as tvm
    from torchvision.models.vision_transformer import interpolate_embeddings

    source = tvm.vit_b_16()
    path = tmp_path / "vit_b_16.pth"
    torch.save(source.state_dict(), path)
    encoder = build_encoder(EncoderConfig(name="vit_b_16", weights=str(path), image_size=64, grid_size=0))
    expected = interpolate_embeddings(64, 16, source.state_dict())["encoder.pos_embedding"]
    assert torch.equal(encoder.backbone.encoder.pos_embedding, expected)


def test_a_file_that_does_not_fit_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "resnet18.pth"
    torch.save(timm.create_model("resnet18").state_dict(), path)
    with raises_naming(EncoderWeightsError, path, "timm:vit_tiny_patch16_224"):
        build_encoder(EncoderConfig(name="timm:vit_tiny_patch16_224", weights=str(path)))


@pytest.mark.parametrize(
    ("name", "names"),
    [
        ("timm:no_such_net", ("'no_such_net'", "timm.list_models()")),
        ("timm:vit_tiny_patch16_224.no_such_tag", ("'no_such_tag'", "vit_tiny_patch16_224.augreg_in21k")),
        ("open_clip:ViT-B-99/openai", ("'ViT-B-99'", "open_clip.list_models()")),
        ("open_clip:ViT-B-32/no_such_tag", ("'no_such_tag'", "ViT-B-32", "openai")),
        (
            "hub:resnet",
            ("model.encoder.name", "vit_b_16", "open_clip:<arch>/<pretrained tag>", "timm:<model name>"),
        ),
    ],
)
def test_bad_names_are_config_errors(name: str, names: tuple[str, ...]) -> None:
    with raises_naming(ConfigError, name, *names):
        build_encoder(EncoderConfig(name=name, weights="none"))


def test_a_vit_image_size_must_be_a_multiple_of_the_patch() -> None:
    with raises_naming(ConfigError, "model.encoder.image_size 100", "16", "vit_b_16"):
        build_encoder(EncoderConfig(name="vit_b_16", weights="none", image_size=100))


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Empty torch hub and Hugging Face caches, and no network: downloads fail as they do offline."""
    import huggingface_hub

    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def no_network(url: str, *args, **kwargs) -> None:
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(torch.hub, "download_url_to_file", no_network)
    return tmp_path


@pytest.mark.parametrize(
    ("name", "place"),
    [
        ("vit_b_16", "hub/checkpoints/vit_b_16-c867db91.pth"),
        ("swin_t", "hub/checkpoints/swin_t-704ceda3.pth"),
        ("convnext_tiny", "hub/checkpoints/convnext_tiny-983f1562.pth"),
        (
            "timm:vit_base_patch16_clip_224.openai",
            "https://huggingface.co/timm/vit_base_patch16_clip_224.openai/resolve/main/model.safetensors",
        ),
        (
            "open_clip:ViT-B-32/openai",
            "https://huggingface.co/timm/vit_base_patch32_clip_224.openai/resolve/main/open_clip_model.safetensors",
        ),
    ],
)
def test_offline_pretrained_stops_within_seconds_naming_the_file_and_where(
    offline: Path, name: str, place: str
) -> None:
    started = time.monotonic()
    with pytest.raises(EncoderWeightsError) as caught:
        build_encoder(EncoderConfig(name=name, weights="pretrained"))
    assert time.monotonic() - started < 30  # before any network wait or model build
    message = str(caught.value)
    assert "\n" not in message and "not found" in message
    assert (str(offline / place) if place.startswith("hub/") else place) in message
    if not place.startswith("hub/"):
        assert "model.encoder.weights" in message and "HF_HUB_OFFLINE" in message


def test_an_unreachable_hub_is_tried_once_with_a_bounded_wait(offline: Path, monkeypatch) -> None:
    # Without HF_HUB_OFFLINE: one download attempt, with a timeout; a second file name would wait as long.
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(weights, "unreachable", lambda url: None)  # the host takes a connection
    calls = []

    def unreachable(repo_id: str, filename: str, **kwargs) -> str:
        calls.append((repo_id, filename, kwargs.get("etag_timeout")))
        raise ConnectionError("connection timed out")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", unreachable)
    with raises_naming(
        EncoderWeightsError,
        "open_clip:ViT-B-32/openai",
        "open_clip_model.safetensors",
        "connection timed out",
    ):
        build_encoder(EncoderConfig(name="open_clip:ViT-B-32/openai", weights="pretrained"))
    assert calls == [("timm/vit_base_patch32_clip_224.openai", "open_clip_model.safetensors", 15.0)]


def test_a_pretrained_file_in_the_hugging_face_cache_is_used_without_network(offline: Path) -> None:
    import huggingface_hub

    source = timm.create_model("vit_tiny_patch16_224.augreg_in21k_ft_in1k")
    snapshot = (
        Path(huggingface_hub.constants.HF_HUB_CACHE)
        / "models--timm--vit_tiny_patch16_224.augreg_in21k_ft_in1k"
    )
    (snapshot / "refs").mkdir(parents=True)
    (snapshot / "refs" / "main").write_text("0" * 40)
    (snapshot / "snapshots" / ("0" * 40)).mkdir(parents=True)
    from safetensors.torch import save_file

    save_file(source.state_dict(), snapshot / "snapshots" / ("0" * 40) / "model.safetensors")
    encoder = build_encoder(
        EncoderConfig(
            name="timm:vit_tiny_patch16_224.augreg_in21k_ft_in1k",
            weights="pretrained",
            image_size=224,
            grid_size=0,
        )
    )
    assert torch.equal(encoder.backbone.model.pos_embed, source.pos_embed)
    assert encoder.fingerprint()["weights"] == {"timm": "vit_tiny_patch16_224.augreg_in21k_ft_in1k"}


# Whole tiny runs through train.py for a transformer grid (a ViT's patch tokens) and a library family
# (a CLIP tower); every other registered name and family example is held to the encoder contract in
# tests/models/test_encoders.py (shapes, grid, stages, the inference copy), which is what a run relies on.
E2E = ["vit_b_16", "open_clip:ViT-B-32/openai"]


@pytest.mark.slow
@pytest.mark.parametrize("name", E2E)
def test_a_tiny_shapes_run_trains_caches_decodes_draws_and_grounds(
    name: str,
    data_root: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    overrides = tiny_overrides(
        data_root,
        run,
        **{
            "model.encoder.name": name,
            "model.encoder.weights": "none",
            "train.epochs": 1,
            "data.cache_dir": str(tmp_path / "features"),
            "decode.beam_size": 1,
        },
    )
    result = in_process("train.py", "--no-progress", *as_flags(overrides), cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]

    indexes = [json.loads(path.read_text()) for path in (tmp_path / "features").rglob("index.json")]
    assert [index["key"]["fingerprint"]["name"] for index in indexes] == [name]  # frozen: features cached
    payload = load_checkpoint(run / "checkpoints" / "best.pt")
    fingerprint = payload["encoder_fingerprint"]
    assert fingerprint["name"] == name and fingerprint["image_size"] == 64
    assert len(fingerprint["normalisation"]["mean"]) == 3 and fingerprint["interpolation"]
    # The size the position embeddings were made for, recorded for transformers (built here at 64 px).
    assert fingerprint.get("position_embedding_size") == (
        None if name in ("swin_t", "convnext_tiny") else 224
    )
    results = json.loads((run / "test_results.json").read_text())
    assert len(results) == 8 and all(isinstance(r["caption"], str) for r in results)
    scores = json.loads((run / "test_scores.json").read_text())
    assert scores["CIDEr-D"] is not None and "grounding-words" in scores
    if scores["grounding-words"]:  # a model this briefly trained may name no object yet
        assert 0 <= scores["grounding-pointing"] <= 1 and 0 <= scores["grounding-mass"] <= 1
    assert list((run / "figures").glob("*.png")) and (run / "report.html").is_file()


@pytest.mark.slow
def test_a_tiny_run_fine_tunes_the_last_block_of_a_vit(data_root: Path, tmp_path: Path) -> None:  # noqa: F811
    run = tmp_path / "run"
    overrides = tiny_overrides(
        data_root,
        run,
        **{
            "model.encoder.name": "timm:vit_tiny_patch16_224",
            "model.encoder.weights": "none",
            "model.encoder.fine_tune_stages": 1,
            "train.epochs": 1,
            "data.cache_dir": str(tmp_path / "features"),
            "decode.beam_size": 1,
        },
    )
    torch.manual_seed(0)
    result = in_process("train.py", "--no-progress", "--no-test", *as_flags(overrides), cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not (tmp_path / "features").exists()  # fine-tuned: features are computed each step, never cached
    first = load_checkpoint(run / "checkpoints" / "last.pt")["encoder"]
    overrides["train.output_dir"] = str(tmp_path / "again")
    overrides["train.epochs"] = 2
    result = in_process("train.py", "--no-progress", "--no-test", *as_flags(overrides), cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    second = load_checkpoint(tmp_path / "again" / "checkpoints" / "last.pt")["encoder"]
    changed = {key for key in first if not torch.equal(first[key], second[key])}
    # The same seed, one more epoch: only the trainable stage (last block and final norm) moved.
    assert changed and all(
        key.startswith(("backbone.model.blocks.11.", "backbone.model.norm.")) for key in changed
    )
