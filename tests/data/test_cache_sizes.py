"""Every feature cache size the documentation gives is the one the shipped configurations make:
each is computed from the encoder as built (``build_encoder(...).grid`` and ``.channels``), on the
meta device (no weights are read)."""

from __future__ import annotations

import dataclasses
import re
from functools import cache

import pytest
import torch
from tool_runs import REPO

from captioning.config import EncoderConfig
from captioning.config.loading import load_config
from captioning.data.cache_store import cache_bytes
from captioning.models.encoders import build_encoder

COCO_IMAGES = 123_287  # COCO 2014 train + val: the Karpathy splits' images
CONFIGS = REPO / "captioning" / "configs"


@cache
def grid_and_channels(encoder: EncoderConfig) -> tuple[tuple[int, int], int]:
    with torch.device("meta"):
        built = build_encoder(dataclasses.replace(encoder, weights="none"))
    return built.grid, built.channels


def of_config(name: str) -> tuple[EncoderConfig, tuple[int, int], int]:
    encoder = load_config(CONFIGS / name).model.encoder
    return (encoder, *grid_and_channels(encoder))


def gb(grid: tuple[int, int], channels: int, images: int = COCO_IMAGES) -> float:
    return cache_bytes(grid, channels, images) / 1e9


def test_the_cache_size_table_is_each_shipped_configurations():
    page = (REPO / "docs" / "coco.md").read_text(encoding="utf-8")
    rows = re.findall(
        r"^\s*\| (.+?) \| (\S+) \| (\d+) \| (\d+)x(\d+) x (\d+) \| ([\d.]+) KiB \| ([\d.]+) GB \|$",
        page,
        re.M,
    )
    named = [name for row in rows for name in re.findall(r"`(\w+\.yaml)`", row[0])]
    cached = [
        path.name
        for path in sorted(CONFIGS.glob("*.yaml"))
        if load_config(path).data.dataset in ("karpathy", "coco") and path.name != "imagefolder.yaml"
    ]
    assert sorted(named) == sorted(cached)  # every configuration of a COCO-sized dataset has its row
    for first, encoder_name, size, gh, gw, channels, kib, size_gb in rows:
        for config in re.findall(r"`(\w+\.yaml)`", first):
            encoder, grid, built_channels = of_config(config)
            assert (encoder.name, encoder.image_size) == (encoder_name, int(size)), config
            assert (grid, built_channels) == ((int(gh), int(gw)), int(channels)), config
            assert f"{cache_bytes(grid, built_channels, 1) / 1024:g}" == kib, config
            assert f"{gb(grid, built_channels):.1f}" == size_gb, config


def test_every_other_size_in_the_docs_and_comments_is_the_configurations():
    lite0, lite0_grid, lite0_channels = of_config("coco_lite0.yaml")
    _, resnet_grid, resnet_channels = of_config("coco_resnet101.yaml")
    _, clip_grid, clip_channels = of_config("coco_clip_vit.yaml")
    lite0_gb, resnet_gb, clip_gb = (
        gb(lite0_grid, lite0_channels),
        gb(resnet_grid, resnet_channels),
        gb(clip_grid, clip_channels),
    )
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert f"a {lite0_gb:.1f} GB feature cache instead of {resnet_gb:.1f} GB" in readme
    coco = (REPO / "docs" / "coco.md").read_text(encoding="utf-8")
    assert f"{lite0_gb:.1f} GB for\n  `coco_lite0.yaml`'s 14x14x1280 rows, {resnet_gb:.1f} GB" in coco
    batch = [
        cache_bytes(grid, channels, 32) / 1e6 for grid, channels in ((lite0_grid, 1280), (resnet_grid, 2048))
    ]
    assert f"32 images: {batch[0]:.1f} MB of 14x14x1280 or {batch[1]:.1f} MB of\n  14x14x2048" in coco
    # "--set model.encoder.image_size=224 gives efficientnet_lite0 a 7x7 grid, 122 KiB per image, 15.5 GB"
    grid_224, channels_224 = grid_and_channels(dataclasses.replace(lite0, image_size=224, grid_size=0))
    kib_224, gb_224 = cache_bytes(grid_224, channels_224, 1) / 1024, gb(grid_224, channels_224)
    said = f"a {grid_224[0]}x{grid_224[1]} grid, {kib_224:.0f} KiB per image, {gb_224:.1f} GB"
    assert said in coco.replace("\n  ", " ")
    notes = (REPO / "docs" / "first-run-notes.md").read_text(encoding="utf-8")
    assert f"about\n{lite0_gb:.0f} GB of cached features" in notes
    comments = {
        name: (CONFIGS / name).read_text(encoding="utf-8")
        for name in ("coco_lite0.yaml", "coco_resnet101.yaml", "coco_clip_vit.yaml")
    }
    assert f"float16: ~{lite0_gb:.0f} GB" in comments["coco_lite0.yaml"]
    assert f"float16: ~{resnet_gb:.0f} GB" in comments["coco_resnet101.yaml"]
    clip_kib = cache_bytes(clip_grid, clip_channels, 1) // 1024
    assert (
        f"{clip_kib} KiB per image; for\n#   the 123,287 images: {clip_gb:.0f} GB"
        in comments["coco_clip_vit.yaml"]
    )


@pytest.mark.parametrize(
    "line", re.findall(r"^\| `\w+` \| .+$", (REPO / "docs" / "cluster.md").read_text(encoding="utf-8"), re.M)
)
def test_the_scale_table_is_each_encoders(line):
    name, size, gh, gw, channels, kib, coco_gb, million_tb = re.fullmatch(
        r"\| `(\w+)` \| (\d+) \| (\d+)x(\d+) x (\d+) \| (\d+) KiB \| ([\d.]+) GB \| ([\d.]+) TB \|", line
    ).groups()
    grid, built_channels = grid_and_channels(EncoderConfig(name=name, image_size=int(size), grid_size=0))
    assert (grid, built_channels) == ((int(gh), int(gw)), int(channels))
    assert f"{cache_bytes(grid, built_channels, 1) / 1024:.0f}" == kib
    assert f"{gb(grid, built_channels):.1f}" == coco_gb
    assert f"{cache_bytes(grid, built_channels, 1_000_000) / 1e12:.2f}" == million_tb
