"""Offline, published weights that must be downloaded fail within seconds, for real: no mocked network.

huggingface_hub retries an unreachable host five times with backoff (about a minute, "Retrying in
8s" lines); ``weights.unreachable`` probes the host once first. These tests run only where the hub
cannot be reached (they would download otherwise).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from captioning.config import EncoderConfig
from captioning.models.encoders import EncoderWeightsError, build_encoder, weights

huggingface_hub = pytest.importorskip("huggingface_hub")
pytest.importorskip("timm")
pytest.importorskip("open_clip")

BOUND_S = 15.0  # a bound on a hang, not a benchmark: the probe's connect waits 3 s at most


@pytest.fixture
def empty_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Empty Hugging Face and torch hub caches, HF_HUB_OFFLINE unset: a download is attempted."""
    if weights.unreachable(huggingface_hub.constants.ENDPOINT) is None:
        pytest.skip("the Hugging Face hub is reachable from here")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    return tmp_path


def _clip_scorer() -> None:
    from captioning.evaluation.clip_score import load_clip_scorer

    load_clip_scorer("pretrained")


def _encoder(name: str) -> Callable[[], None]:
    return lambda: build_encoder(EncoderConfig(name=name, weights="pretrained"))


@pytest.mark.parametrize(
    ("load", "names", "setting"),
    [
        (_encoder("timm:vit_tiny_patch16_224"), "timm:vit_tiny_patch16_224", "model.encoder.weights"),
        (_encoder("open_clip:ViT-B-32/openai"), "open_clip:ViT-B-32/openai", "model.encoder.weights"),
        (_clip_scorer, "open_clip:ViT-B-32/openai", "--clip-score"),
    ],
    ids=["timm", "open_clip", "clip-score"],
)
def test_an_offline_download_fails_within_seconds_with_the_one_line_error(
    empty_caches: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    load: Callable[[], None],
    names: str,
    setting: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    started = time.monotonic()
    with pytest.raises(EncoderWeightsError) as caught:
        load()
    elapsed = time.monotonic() - started
    assert elapsed < BOUND_S, f"took {elapsed:.1f} s"
    message = str(caught.value)
    assert "\n" not in message and f"pretrained weights {names} not found" in message
    assert "unreachable" in message and f"set {setting} to its path" in message
    out, err = capfd.readouterr()
    assert "Retrying" not in out + err + caplog.text


def test_a_cached_file_is_used_without_probing_the_network(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(weights, "unreachable", lambda url: pytest.fail("probed the network"))
    snapshot = tmp_path / "models--timm--tiny" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (tmp_path / "models--timm--tiny" / "refs").mkdir()
    (tmp_path / "models--timm--tiny" / "refs" / "main").write_text("0" * 40)
    (snapshot / "model.safetensors").write_bytes(b"weights")
    assert weights.hub_file("timm/tiny", ["model.safetensors"], "timm:tiny") == snapshot / "model.safetensors"
