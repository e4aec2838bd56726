"""What a removed cell holds (``dataset_mean``, ``zeros``, ``blur``, an array) and what each method
explains (``log_prob``, ``logit``, ``prob``), each against a computation written here: the training
split's mean grid feature encoded by hand, occlusion's drops read from the decoder's logits, gradient x
input by autograd on the chosen score."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageFilter
from tiny_models import tiny_checkpoint

import captioning
from captioning.config import LSTMDecoderConfig
from captioning.data.shapes import ShapesFiles
from captioning.data.vocab import Vocabulary
from captioning.explain import baselines
from captioning.explain.baselines import BASELINE_FILE
from captioning.explain.captions import explain_batch
from captioning.explain.methods import ExplainSettings
from captioning.explain.scoring import caption_tensor
from captioning.models.decoder import ShowAttendTellDecoder

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, tiny_shapes: ShapesFiles, shapes_vocab: Vocabulary):
    folder = tmp_path_factory.mktemp("run_baselines")
    return tiny_checkpoint(folder / "checkpoints" / "best.pt", tiny_shapes.root, shapes_vocab, "lstm")


@pytest.fixture(scope="module")
def images(tiny_shapes: ShapesFiles) -> list[Path]:
    return sorted((tiny_shapes.root / "test").glob("*.png"))[:2]


def encoded(model, pictures: list[Image.Image]) -> torch.Tensor:
    """(N, P, C) grids of the pictures through the model's own encoder."""
    with torch.no_grad():
        pixels = torch.stack([model.captioner.encoder.transform(p) for p in pictures])
        return model.captioner.encode(pixels).float()


def word_log_probs(model, grids: torch.Tensor, words: list[str]) -> torch.Tensor:
    """(M, T) log p of each word of one caption under M grids, from the decoder's teacher-forced logits."""
    tokens = [model.vocab.stoi[w] for w in words]
    row = torch.tensor([[model.vocab.start_id, *tokens, model.vocab.end_id]])
    captions, lengths = row.expand(grids.size(0), -1), torch.full((grids.size(0),), row.size(1))
    with torch.no_grad():
        logits = model.captioner.decoder(grids, captions, lengths).logits[:, : len(tokens)]
    return torch.log_softmax(logits.double(), -1).gather(2, captions[:, 1 : len(tokens) + 1, None])[..., 0]


def occlusion_by_hand(model, grid: torch.Tensor, baseline_grid: torch.Tensor, words: list[str]) -> np.ndarray:
    """(T, P): the drop in each word's log p when cell p takes the baseline grid's cell p."""
    cells = grid.size(0)
    occluded = grid.unsqueeze(0).repeat(cells, 1, 1)
    occluded[torch.arange(cells), torch.arange(cells)] = baseline_grid
    full = word_log_probs(model, grid.unsqueeze(0), words)  # (1, T)
    return (full - word_log_probs(model, occluded, words)).T.numpy()  # (T, P)


def test_the_default_baseline_is_the_training_mean_computed_once_and_kept(
    checkpoint: Path, images, tiny_shapes: ShapesFiles, monkeypatch: pytest.MonkeyPatch
):
    model = captioning.load(checkpoint, device="cpu")
    alone = model.explain(images[:1], ["occlusion"], curves=False)[0]
    kept = json.loads((checkpoint.parents[1] / BASELINE_FILE).read_text())
    # by hand: every training image through the encoder, the mean over images and cells
    train = [Image.open(path).convert("RGB") for path in sorted((tiny_shapes.root / "train").glob("*.png"))]
    mean = encoded(model, train).double().mean(dim=(0, 1))
    np.testing.assert_allclose(kept["mean"], mean.numpy(), atol=2e-3, rtol=2e-3)  # cached as float16
    assert kept["images"] == len(train)
    # occlusion with that feature in the cell, by hand
    grid = encoded(model, [Image.open(images[0]).convert("RGB")])[0]
    expected = occlusion_by_hand(model, grid, torch.tensor(kept["mean"]).expand_as(grid), alone.caption.words)
    np.testing.assert_allclose(
        alone.maps["occlusion"].reshape(len(alone.caption.words), -1), expected, atol=1e-4
    )
    # an image's maps no longer depend on the images explained with it
    together = model.explain(images, ["occlusion"], curves=False)[0]
    np.testing.assert_allclose(together.maps["occlusion"], alone.maps["occlusion"], atol=1e-5)
    # a new load reads the kept mean back: nothing of the training split is read again
    monkeypatch.setattr(baselines, "caption_dataset", lambda *a, **k: pytest.fail("recomputed"))
    again = captioning.load(checkpoint, device="cpu").explain(images[:1], ["occlusion"], curves=False)[0]
    np.testing.assert_allclose(again.maps["occlusion"], alone.maps["occlusion"], atol=1e-6)


def test_zeros_and_blur_baselines_by_hand(checkpoint: Path, images):
    model = captioning.load(checkpoint, device="cpu")
    zeros = model.explain(images[:1], ["occlusion"], curves=False, baseline="zeros")[0]
    given = model.explain(images[:1], ["occlusion"], curves=False, baseline=np.zeros(1280))[0]
    np.testing.assert_allclose(zeros.maps["occlusion"], given.maps["occlusion"], atol=1e-6)
    blurred = model.explain(images[:1], ["occlusion"], curves=True, baseline="blur", curve_steps=4)[0]
    picture = Image.open(images[0]).convert("RGB")
    sigma = 10 / 224 * min(picture.size)  # Fong and Vedaldi's strongest blur, at 224 pixels
    grid, blurred_grid = encoded(model, [picture, picture.filter(ImageFilter.GaussianBlur(sigma))])
    words = blurred.caption.words
    expected = occlusion_by_hand(model, grid, blurred_grid, words)
    np.testing.assert_allclose(blurred.maps["occlusion"].reshape(len(words), -1), expected, atol=1e-4)
    # insertion starts from the blurred image: its first point is each word's probability there
    first = word_log_probs(model, blurred_grid.unsqueeze(0), words)[0].exp().numpy()
    np.testing.assert_allclose(blurred.curves.insertion["occlusion"][:, 0], first, rtol=1e-4)


C, P = 3, 6


@pytest.mark.parametrize("score", ["log_prob", "logit", "prob"])
def test_the_explained_score_is_the_one_chosen(score: str):
    """Gradient x input of the chosen score of each word, against autograd on the decoder's logits."""
    torch.manual_seed(0)
    config = LSTMDecoderConfig(embed_dim=8, hidden_dim=8, attention_dim=8, dropout=0.0)
    decoder = ShowAttendTellDecoder.from_config(config, 11, C).double().eval()
    annotations = torch.rand(2, P, C, dtype=torch.float64)
    tokens = [[4, 7, 5], [6, 8]]
    maps, _ = explain_batch(
        decoder, annotations, tokens, ["gradient"], torch.zeros(C), ExplainSettings(), score
    )
    captions, lengths = caption_tensor(tokens, 1, 2)
    for b, caption in enumerate(tokens):
        for t, word in enumerate(caption):
            grid = annotations[b : b + 1].clone().requires_grad_(True)
            logits = decoder(grid, captions[b : b + 1], lengths[b : b + 1]).logits[0, t]
            value = {
                "logit": logits[word],
                "log_prob": torch.log_softmax(logits, -1)[word],
                "prob": torch.softmax(logits, -1)[word],
            }[score]
            (gradient,) = torch.autograd.grad(value, grid)
            expected = (gradient * grid).sum(-1)[0].detach()
            torch.testing.assert_close(maps["gradient"][b, t].double(), expected, rtol=1e-4, atol=1e-6)


def test_no_baseline_is_computed_where_nothing_reads_one(checkpoint: Path, images, monkeypatch):
    """Attention, gradient x input and Grad-CAM read no baseline: without curves none is computed (the
    demo's maps of a model whose training images are elsewhere); a method that reads one asks for it."""
    from captioning.explain import explaining

    model = captioning.load(checkpoint, device="cpu")
    monkeypatch.setattr(explaining, "training_mean", lambda *a, **k: pytest.fail("computed"))
    explained = model.explain(images[:1], ["attention", "gradient", "gradcam"], curves=False)[0]
    assert set(explained.maps) == {"attention", "gradient", "gradcam"}
    with pytest.raises(BaseException, match="computed"):
        model.explain(images[:1], ["occlusion"], curves=False)
    with pytest.raises(BaseException, match="computed"):
        model.explain(images[:1], ["attention"], curves=True)
