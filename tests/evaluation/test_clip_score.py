"""CLIP-S and RefCLIP-S: equal to a hand computation of Hessel et al.'s definitions with the same
(random, saved and reloaded) CLIP ViT-B/32; evaluate.py --clip-score end to end; refused without weights."""

from __future__ import annotations

import json
import urllib.error
from pathlib import Path

import pytest
import torch
from messages import raises_naming
from PIL import Image
from test_visualize_cli import checkpoint  # noqa: F401 (a fixture: an untrained tiny captioner on tiny Shapes)
from tool_runs import in_process
from torchvision import transforms

from captioning.config import ConfigError
from captioning.evaluation.clip_score import clip_scores, load_clip_scorer
from captioning.evaluation.signature import parse_signature
from captioning.models.encoders import EncoderWeightsError, file_identity

open_clip = pytest.importorskip("open_clip")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def clip_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    """A randomly initialised CLIP ViT-B/32 (QuickGELU, as OpenAI's) saved as a state-dict file."""
    torch.manual_seed(0)
    model = open_clip.create_model("ViT-B-32", force_quick_gelu=True).eval()
    path = tmp_path_factory.mktemp("clip") / "clip_vit_b_32.pt"
    torch.save(model.state_dict(), path)
    return path, model


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    folder = tmp_path_factory.mktemp("images")
    paths = {}
    for image_id, (size, colour) in enumerate(
        [
            ((97, 41), (30, 30, 200)),
            ((40, 80), (220, 40, 40)),
            ((64, 64), (20, 180, 60)),
            ((120, 90), (240, 240, 240)),
        ]
    ):
        image = Image.new("RGB", size, colour)
        image.paste((255 - colour[0], 128, colour[2] // 2), (5, 5, size[0] // 2, size[1] // 2))
        paths[image_id] = folder / f"{image_id}.png"
        image.save(paths[image_id])
    return paths


CANDIDATES = {
    0: "a blue square",
    1: "a red circle next to a line",
    2: "green",
    3: "a white picture of nothing",
}
REFERENCES = {
    0: ["a blue square on the left", "blue"],
    1: ["a red shape"],
    2: ["a green field", "grass", "lawn"],
    3: ["white"],
}


def by_hand(model: torch.nn.Module, images: dict[int, Path]) -> dict[int, tuple[float, float]]:
    """Hessel et al. 2021, equations 1 and 2, written out: CLIP's preprocessing (resize the short side to
    224 bicubic, centre crop, OpenAI's mean and std), the prefix "A photo depicts", w = 2.5."""
    preprocess = transforms.Compose(
        [
            transforms.Resize(224, interpolation=transforms.InterpolationMode.BICUBIC),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
        ]
    )
    tokenizer = open_clip.get_tokenizer("ViT-B-32")
    expected = {}
    with torch.no_grad():
        for image_id, path in images.items():
            v = model.encode_image(preprocess(Image.open(path).convert("RGB"))[None])[0]
            c = model.encode_text(tokenizer(["A photo depicts " + CANDIDATES[image_id]]))[0]
            refs = model.encode_text(tokenizer(["A photo depicts " + r for r in REFERENCES[image_id]]))
            clip_s = 2.5 * max(torch.cosine_similarity(c, v, dim=0).item(), 0.0)
            best = max(max(torch.cosine_similarity(c[None], refs, dim=1).tolist()), 0.0)
            expected[image_id] = (clip_s, 2 * clip_s * best / (clip_s + best) if clip_s + best > 0 else 0.0)
    return expected


@pytest.mark.slow
def test_clip_s_and_ref_clip_s_equal_a_hand_computation(clip_file, images) -> None:
    path, model = clip_file
    scorer = load_clip_scorer(str(path))  # reloaded from the file through the encoders' weights path
    # batches of 3: across a boundary
    scores = clip_scores(scorer, images, CANDIDATES, REFERENCES, batch_size=3)
    expected = by_hand(model, images)
    for image_id, (clip_s, ref_clip_s) in expected.items():
        assert scores["per_image"][image_id]["CLIP-S"] == pytest.approx(clip_s, abs=1e-5)
        assert scores["per_image"][image_id]["RefCLIP-S"] == pytest.approx(ref_clip_s, abs=1e-5)
    assert scores["CLIP-S"] == pytest.approx(sum(v[0] for v in expected.values()) / 4, abs=1e-5)
    assert scores["RefCLIP-S"] == pytest.approx(sum(v[1] for v in expected.values()) / 4, abs=1e-5)
    assert any(v[0] > 0 for v in expected.values())  # the clipping at 0 is not all that was compared
    assert scorer.description == f"ViT-B-32.openai.{file_identity(path)['sha256'][:12]}"
    assert clip_scores(scorer, images, CANDIDATES)["RefCLIP-S"] is None  # reference-free alone


def test_clip_score_is_refused_without_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with raises_naming(ConfigError, "--clip-score", "pretrained", "none"):
        load_clip_scorer("none")
    with raises_naming(EncoderWeightsError, tmp_path / "nowhere.pt", "--clip-score"):
        load_clip_scorer(str(tmp_path / "nowhere.pt"))
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(
        torch.hub,
        "download_url_to_file",
        lambda *a, **k: (_ for _ in ()).throw(urllib.error.URLError("offline")),
    )
    with pytest.raises(EncoderWeightsError) as caught:
        load_clip_scorer("pretrained")
    message = str(caught.value)
    assert "\n" not in message and "open_clip_model.safetensors" in message and "--clip-score" in message


@pytest.mark.slow
def test_evaluate_writes_clip_scores_per_image_and_signs_them(
    checkpoint: Path,  # noqa: F811
    clip_file,
    tmp_path: Path,
) -> None:
    path, _ = clip_file
    out = tmp_path / "scores.json"
    result = in_process(
        "evaluate.py",
        "--checkpoint",
        checkpoint,
        "--split",
        "test",
        "--clip-score",
        path,
        "--no-java",
        "--no-progress",
        "--out",
        out,
        "--results",
        tmp_path / "results.json",
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    scores = json.loads(out.read_text())
    per_image = json.loads(out.with_name("scores.per_image.json").read_text())
    assert len(per_image) == 4 and all(
        0 <= entry["CLIP-S"] <= 2.5 and "RefCLIP-S" in entry for entry in per_image
    )
    assert scores["CLIP-S"] == pytest.approx(sum(entry["CLIP-S"] for entry in per_image) / 4)
    assert (
        parse_signature(scores["signature"])["clip"]
        == f"ViT-B-32.openai.{file_identity(path)['sha256'][:12]}"
    )
    assert "CLIP-S" in result.stdout


def test_evaluate_refuses_clip_score_before_decoding(checkpoint: Path, tmp_path: Path) -> None:  # noqa: F811
    result = in_process(
        "evaluate.py",
        "--checkpoint",
        checkpoint,
        "--split",
        "test",
        "--clip-score",
        tmp_path / "missing.pt",
        "--no-progress",
        "--results",
        tmp_path / "results.json",
        cwd=ROOT,
    )
    assert result.returncode != 0
    error = result.stderr.strip().splitlines()[-1]  # the file, and the flag that named it
    assert str(tmp_path / "missing.pt") in error and "--clip-score" in error, result.stderr
    assert not (tmp_path / "results.json").exists()  # stopped before decoding
    result = in_process(
        "evaluate.py",
        "--annotations",
        tmp_path / "a.json",
        "--results",
        tmp_path / "r.json",
        "--clip-score",
        cwd=ROOT,
    )
    assert result.returncode != 0 and "--clip-score scores the images of a split" in result.stderr
