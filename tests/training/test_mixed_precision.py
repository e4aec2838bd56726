"""Mixed precision on CPU: bf16 autocast trains and decodes; fp16 is refused before any work."""

from __future__ import annotations

import os

import pytest
import torch
from messages import raises_naming
from search_options import settings
from test_faults import assert_one_line_error
from test_training import REPO, as_flags, read_steps, run_train, tiny_overrides, train_in_process

from captioning.config import ConfigError, LSTMDecoderConfig
from captioning.data.vocab import Vocabulary
from captioning.models.decoder import ShowAttendTellDecoder
from captioning.models.decoding import beam_search
from captioning.utils.device import autocast, bf16_cost

# bf16 keeps 8 bits of mantissa (relative rounding 2**-8 = 0.4 % per product); the tiny run's
# logged losses stayed within 0.02 % of float32's over its 8 steps (the loss itself is float32).
BF16_LOSS_TOLERANCE = 0.004  # relative, per logged step


@pytest.fixture(scope="module")
def shapes_root(tmp_path_factory):
    """Tiny Shapes data and its feature cache, written by a first float32 run's set-up."""
    return tmp_path_factory.mktemp("shapes")


def _losses(root, output_dir, amp: str) -> list[float]:
    overrides = tiny_overrides(
        root,
        output_dir,
        **{"train.amp": amp, "train.device": "cpu", "train.epochs": 1, "train.val_images": 4},
    )
    completed = run_train(
        as_flags(overrides), env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    return [step["loss"] for step in read_steps(output_dir)]


@pytest.mark.slow
def test_bf16_training_on_cpu_lowers_the_loss_and_follows_float32(shapes_root, tmp_path):
    full = _losses(shapes_root, tmp_path / "fp32", "none")
    half = _losses(shapes_root, tmp_path / "bf16", "bf16")
    assert len(half) == len(full) == 8  # 32 images / 4 per batch
    assert half != full  # autocast was on: bf16 rounding changes every step's loss
    for step, (a, b) in enumerate(zip(full, half, strict=True), start=1):
        assert abs(a - b) <= BF16_LOSS_TOLERANCE * abs(a), f"step {step}: float32 {a:.5f}, bf16 {b:.5f}"
    assert sum(half[-3:]) / 3 < half[0]


def test_fp16_on_cpu_is_refused_in_one_line_before_any_work(shapes_root, tmp_path):
    output_dir = tmp_path / "run"
    overrides = tiny_overrides(shapes_root, output_dir, **{"train.amp": "fp16", "train.device": "cpu"})
    completed = train_in_process(as_flags(overrides))
    assert_one_line_error(completed.returncode, completed.stderr, "train.amp", "fp16", "bf16")
    assert not output_dir.exists()


@pytest.mark.slow
def test_bf16_on_a_cpu_without_bf16_instructions_is_named_in_the_plan(shapes_root, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")  # a Zen 2 EPYC
    overrides = {"train.amp": "bf16", "train.device": "cpu", "train.max_steps": 1}
    completed = train_in_process(as_flags(tiny_overrides(shapes_root, tmp_path / "run", **overrides)))
    assert completed.returncode == 0, completed.stderr[-2000:]
    lines = completed.stdout.splitlines()
    plan = next(k for k, line in enumerate(lines) if line.startswith("plan: "))
    # the setting, the CPU's capability, and the fix
    assert all(name in lines[plan] for name in ("train.amp=bf16", "AVX2", "set train.amp=none")), lines[plan]
    assert not any(line.startswith("epoch") for line in lines[:plan])  # said before any step

    # A CPU that multiplies bf16 natively, and float32 anywhere, say nothing.
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    assert bf16_cost(torch.device("cpu"), "bf16") is None
    assert bf16_cost(torch.device("cpu"), "none") is None
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    converted = bf16_cost(torch.device("cpu"), "bf16")
    assert converted is not None and "AVX512" in converted and "bf16" in converted
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert bf16_cost(torch.device("cuda"), "bf16") is None  # a GPU's bf16 is its own


def test_autocast_refuses_fp16_on_cpu_and_casts_bf16():
    with raises_naming(ConfigError, "train.amp", "fp16", "bf16"):
        autocast(torch.device("cpu"), "fp16")
    layer = torch.nn.Linear(4, 4)
    with autocast(torch.device("cpu"), "bf16"):
        assert layer(torch.ones(2, 4)).dtype == torch.bfloat16
    with autocast(torch.device("cpu"), "none"):
        assert layer(torch.ones(2, 4)).dtype == torch.float32


def test_bf16_beam_search_on_cpu_returns_valid_captions():
    torch.manual_seed(0)
    vocab_size, channels = 40, 24
    decoder = ShowAttendTellDecoder.from_config(
        LSTMDecoderConfig(embed_dim=16, hidden_dim=32, attention_dim=16), vocab_size, channels
    ).eval()
    annotations = torch.rand(3, 9, channels)  # (B, P, C)
    with torch.inference_mode():
        reference = beam_search(decoder, annotations, settings(beam_size=3, max_length=10))
        with autocast(torch.device("cpu"), "bf16"):
            captions = beam_search(decoder, annotations, settings(beam_size=3, max_length=10))
    assert len(captions) == 3
    for caption, exact in zip(captions, reference, strict=True):
        assert 1 <= len(caption.tokens) <= 10
        assert all(Vocabulary.end_id != t and t >= 4 and t < vocab_size for t in caption.tokens[:-1])
        assert caption.attention.dtype == torch.float32 and caption.attention.shape == (
            len(caption.tokens),
            9,
        )
        torch.testing.assert_close(
            caption.attention.sum(1), torch.ones(len(caption.tokens)), atol=2e-2, rtol=0
        )
        assert isinstance(caption.log_prob, float) and caption.log_prob < 0
        # float32 sums of bf16-rounded log-probabilities: close to float32's
        if caption.tokens == exact.tokens:
            assert abs(caption.log_prob - exact.log_prob) <= 0.05 * abs(exact.log_prob)
    assert sum(c.tokens == e.tokens for c, e in zip(captions, reference, strict=True)) >= 2
    assert any(c.log_prob != e.log_prob for c, e in zip(captions, reference, strict=True))  # decoded in bf16
