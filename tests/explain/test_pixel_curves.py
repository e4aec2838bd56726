"""RISE's deletion and insertion in pixel space equal an explicit loop written here from the published
protocol (Petsiuk et al. 2018, ``evaluation.py``'s ``CausalMetric.single_run``): blur the image, take
its pixels in the upsampled map's order, change ``step`` of them at a time, encode, score the word."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from messages import raises_naming
from scipy.ndimage import correlate, gaussian_filter

from captioning.config import EncoderConfig, LSTMDecoderConfig, ModelConfig
from captioning.data.vocab import Vocabulary
from captioning.explain.pixel_curves import (
    PixelCurveSettings,
    change_counts,
    method_pixel_curves,
    pixel_curves,
    random_pixel_ranks,
)
from captioning.explain.scoring import WordScorer, caption_tensor
from captioning.models.captioner import Captioner
from captioning.utils.errors import InputError

pytestmark = pytest.mark.usefixtures("single_thread")

SIZE = 64  # the offline pretrained efficientnet_lite0 at 64 px: a 2 x 2 grid whose features vary


@pytest.fixture(scope="module")
def model() -> Captioner:
    torch.manual_seed(0)
    vocab = Vocabulary(
        ["<pad>", "<start>", "<end>", "<unk>", "circle", "red", "large", "square", "green", "a", "and"]
    )
    config = ModelConfig(
        encoder=EncoderConfig(name="efficientnet_lite0", weights="pretrained", image_size=SIZE, grid_size=0),
        decoder=LSTMDecoderConfig(embed_dim=16, hidden_dim=16, attention_dim=16, dropout=0.0),
    )
    return Captioner.build(config, vocab).eval()


def bilinear(grid_map: np.ndarray, height: int, width: int) -> np.ndarray:
    """A (gh, gw) map stretched to (height, width): each cell's value at its centre, pixel centres at
    half-pixel offsets, clamped at the borders (bilinear interpolation written out)."""
    gh, gw = grid_map.shape
    out = np.empty((height, width))
    for y in range(height):
        sy = max((y + 0.5) * gh / height - 0.5, 0.0)
        y0 = int(math.floor(sy))
        y1, ly = min(y0 + 1, gh - 1), sy - y0
        for x in range(width):
            sx = max((x + 0.5) * gw / width - 0.5, 0.0)
            x0 = int(math.floor(sx))
            x1, lx = min(x0 + 1, gw - 1), sx - x0
            top = grid_map[y0, x0] * (1 - lx) + grid_map[y0, x1] * lx
            bottom = grid_map[y1, x0] * (1 - lx) + grid_map[y1, x1] * lx
            out[y, x] = top * (1 - ly) + bottom * ly
    return out


def rise_loop(model, image, tokens, t, order, settings):
    """The published protocol for word t of ``tokens`` on one (3, H, W) image, pixels in ``order``:
    its deletion and insertion curves and their areas."""
    channels, height, width = image.shape
    pixels = height * width
    delta = np.zeros((settings.blur_size, settings.blur_size))
    delta[settings.blur_size // 2, settings.blur_size // 2] = 1
    kernel = gaussian_filter(delta, settings.blur_sigma)  # RISE's gkern
    blur = np.stack([correlate(image[c], kernel, mode="constant", cval=0.0) for c in range(channels)])
    step = math.ceil(pixels / settings.steps)
    n = math.ceil(pixels / step)
    captions, lengths = caption_tensor([tokens])

    def probability(picture: np.ndarray) -> float:
        with torch.no_grad():
            grid = model.encode(torch.from_numpy(picture.astype(np.float32)).view(1, channels, height, width))
            logits = model.decoder(grid, captions, lengths).logits[0, t]
        return torch.softmax(logits.double(), -1)[tokens[t]].item()

    curves = {}
    for mode, start, finish in (
        ("deletion", image, np.full_like(image, settings.deletion_value)),
        ("insertion", blur, image),
    ):
        current = start.reshape(channels, pixels).copy()
        target = finish.reshape(channels, pixels)
        scores = []
        for i in range(n + 1):
            scores.append(probability(current))
            if i < n:
                coords = order[step * i : step * (i + 1)]
                current[:, coords] = target[:, coords]
        scores = np.array(scores)
        curves[mode] = (scores, (scores.sum() - scores[0] / 2 - scores[-1] / 2) / (len(scores) - 1))
    return curves


def map_order(grid_map: np.ndarray, seed: int) -> list[int]:
    """The pixels, highest upsampled value first, equal values in the seeded random order."""
    values = bilinear(grid_map, SIZE, SIZE).reshape(-1)
    ties = torch.randperm(values.size, generator=torch.Generator().manual_seed(seed)).numpy()
    place = np.empty(values.size, dtype=int)
    place[ties] = np.arange(values.size)
    return sorted(range(values.size), key=lambda p: (-values[p], place[p]))


CAPTIONS = [[9, 6, 4], [8, 7, 5, 10]]
# small whole numbers upsample exactly (the bilinear weights are multiples of 1/64): ties are ties
MAPS = {
    (0, 0): [[2.0, 0.0], [0.0, 1.0]],
    (0, 2): [[0.0, 0.0], [0.0, 0.0]],  # all tied: the seeded order alone
    (1, 1): [[1.0, 1.0], [3.0, 0.0]],
    (1, 3): [[0.0, 2.0], [2.0, 0.0]],
}


@pytest.mark.parametrize(
    "settings",
    [
        PixelCurveSettings(steps=4, batch_images=5),
        PixelCurveSettings(
            steps=3, deletion_value=0.5, blur_size=5, blur_sigma=2.0, tie_seed=3, batch_images=64
        ),
    ],
    ids=["rise_defaults", "partial_last_step"],
)
def test_pixel_curves_equal_the_published_loop(model: Captioner, settings: PixelCurveSettings):
    images = torch.randn(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
    captions, lengths = caption_tensor(CAPTIONS)
    scorer = WordScorer(model.decoder, captions, lengths)
    words = torch.tensor(list(MAPS))
    maps = torch.tensor([MAPS[key] for key in MAPS]).view(len(MAPS), -1)
    result = method_pixel_curves(model.encode, scorer.words_at, images, maps, words, model.grid, settings)
    assert (result.deletion.std(1) > 1e-3).all() and (result.insertion.std(1) > 1e-3).all()  # not flat
    for w, (row, t) in enumerate(MAPS):
        order = map_order(np.array(MAPS[(row, t)]), settings.tie_seed)
        expected = rise_loop(model, images[row].double().numpy(), CAPTIONS[row], t, order, settings)
        np.testing.assert_allclose(result.deletion[w].numpy(), expected["deletion"][0], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(
            result.insertion[w].numpy(), expected["insertion"][0], rtol=1e-4, atol=1e-6
        )
        assert result.deletion_area[w].item() == pytest.approx(expected["deletion"][1], rel=1e-4)
        assert result.insertion_area[w].item() == pytest.approx(expected["insertion"][1], rel=1e-4)


def test_a_random_order_is_a_permutation_and_runs_as_given(model: Captioner):
    settings = PixelCurveSettings(steps=2)
    images = torch.randn(1, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(2))
    captions, lengths = caption_tensor(CAPTIONS[:1])
    scorer = WordScorer(model.decoder, captions, lengths)
    ranks = random_pixel_ranks(2, SIZE * SIZE, seed=5)
    assert sorted(ranks[0].tolist()) == list(range(SIZE * SIZE)) and not torch.equal(ranks[0], ranks[1])
    torch.testing.assert_close(ranks, random_pixel_ranks(2, SIZE * SIZE, seed=5))
    words = torch.tensor([[0, 1], [0, 2]])
    result = pixel_curves(model.encode, scorer.words_at, images, ranks, words, settings)
    for w in range(2):
        order = torch.argsort(ranks[w]).tolist()
        expected = rise_loop(
            model, images[0].double().numpy(), CAPTIONS[0], int(words[w, 1]), order, settings
        )
        np.testing.assert_allclose(result.deletion[w].numpy(), expected["deletion"][0], rtol=1e-4, atol=1e-6)


def test_steps_as_rise_counts_them():
    # RISE's step = 224 on 224 x 224 images: 224 steps of one row
    counts = change_counts(224 * 224, 224)
    assert counts.numel() == 225 and counts[1] == 224 and counts[-1] == 224 * 224
    assert change_counts(10, 3).tolist() == [0, 4, 8, 10]


@pytest.mark.parametrize(
    ("values", "names"),
    [
        ({"steps": 0}, ["steps", "0"]),
        ({"blur_size": 4}, ["blur_size", "odd", "4"]),
        ({"blur_sigma": 0.0}, ["blur_sigma", "0"]),
        ({"deletion_value": float("nan")}, ["deletion_value", "nan"]),
    ],
)
def test_bad_settings_are_refused_naming_them(values, names):
    with raises_naming(InputError, *names):
        PixelCurveSettings(**values)
