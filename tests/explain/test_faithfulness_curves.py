"""Deletion and insertion on a constructed model whose word depends on one known cell: a map pointing at
it gives the ideal curves, a random map the random control's (the randomisation tests:
test_randomisation_tests.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from captioning.config import LSTMDecoderConfig
from captioning.explain.faithfulness import (
    CurveSettings,
    area,
    method_curves,
    random_curves,
    ranked,
    shares,
    summarise,
)
from captioning.explain.scoring import WordScorer, caption_tensor
from captioning.models.decoder import ShowAttendTellDecoder

pytestmark = pytest.mark.usefixtures("single_thread")

P, C, KEY = 8, 3, 5
FULL, EMPTY = torch.sigmoid(torch.tensor(5.0)).item(), torch.sigmoid(torch.tensor(-5.0)).item()


def key_cell_word(annotations: torch.Tensor, rows: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """A word whose log-probability reads only cell KEY's first channel: p = sigmoid(10 (a - 0.5))."""
    return torch.nn.functional.logsigmoid(10 * (annotations[:, KEY, 0] - 0.5))


def image() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    annotations = torch.ones(1, P, C)  # the image: every feature 1
    baseline = torch.zeros(C)  # a removed cell: 0
    words = torch.tensor([[0, 0]])  # one word: caption 0, word 0
    return annotations, baseline, words


def test_a_map_on_the_key_cell_gives_the_ideal_curves():
    annotations, baseline, words = image()
    settings = CurveSettings(steps=P, random_seeds=1)
    pointing = torch.zeros(1, P)
    pointing[0, KEY] = 1.0
    result = method_curves(key_cell_word, annotations, baseline, pointing, words, settings)
    # deletion: the key cell goes first, the word's probability falls at once; insertion: rises at once
    np.testing.assert_allclose(result.deletion[0].numpy(), [FULL] + [EMPTY] * P, rtol=1e-5)
    np.testing.assert_allclose(result.insertion[0].numpy(), [EMPTY] + [FULL] * P, rtol=1e-5)
    ideal_deletion = (FULL + EMPTY) / (2 * P) + EMPTY * (P - 1) / P
    assert result.deletion_area.item() == pytest.approx(ideal_deletion, rel=1e-5)
    # a map that ranks the key cell last: the worst curves
    last = method_curves(key_cell_word, annotations, baseline, -pointing, words, settings)
    np.testing.assert_allclose(last.deletion[0].numpy(), [FULL] * P + [EMPTY], rtol=1e-5)


def test_a_random_map_gives_the_random_controls_curve():
    annotations, baseline, words = image()
    settings = CurveSettings(steps=P, random_seeds=400)
    control = random_curves(key_cell_word, annotations, baseline, words, settings)
    mean = torch.stack([c.deletion[0] for c in control]).mean(0).numpy()
    # the key cell is among the first k of a random order with probability k / P
    k = np.arange(P + 1)
    expected = EMPTY + (FULL - EMPTY) * (1 - k / P)
    np.testing.assert_allclose(mean, expected, atol=0.06)
    areas = np.array([c.deletion_area.item() for c in control])
    random_map = torch.rand(1, P, generator=torch.Generator().manual_seed(7))
    result = method_curves(key_cell_word, annotations, baseline, random_map, words, settings)
    # a random map's area is one draw of the control's distribution
    assert areas.min() <= result.deletion_area.item() <= areas.max()
    assert area(torch.tensor(expected), shares(P, P)).item() == pytest.approx(areas.mean(), abs=0.03)
    pointing = torch.zeros(1, P)
    pointing[0, KEY] = 1.0
    table = summarise(
        {"pointing": method_curves(key_cell_word, annotations, baseline, pointing, words, settings)},
        control,
        torch.tensor([True]),
    )
    assert table["pointing"]["deletion_gap"] > 0.3 and table["pointing"]["insertion_gap"] > 0.3
    assert table["random"]["deletion_auc_std"] > 0


def tiny_lstm() -> ShowAttendTellDecoder:
    torch.manual_seed(0)
    config = LSTMDecoderConfig(embed_dim=8, hidden_dim=8, attention_dim=8, dropout=0.0)
    return ShowAttendTellDecoder.from_config(config, 11, C).eval()


def test_the_curves_read_the_real_decoders_words():
    decoder = tiny_lstm()
    annotations = torch.rand(2, P, C, generator=torch.Generator().manual_seed(0))
    captions, lengths = caption_tensor([[4, 7, 5], [6, 8]], 1, 2)
    scorer = WordScorer(decoder, captions, lengths)
    index = scorer.word_mask.nonzero()
    with torch.no_grad():
        full = scorer.all_words(annotations)[index[:, 0], index[:, 1]].exp()
        empty = scorer.all_words(torch.zeros_like(annotations))[index[:, 0], index[:, 1]].exp()
    maps = torch.rand(index.size(0), P)
    result = method_curves(scorer.words_at, annotations, torch.zeros(C), maps, index, CurveSettings(steps=4))
    torch.testing.assert_close(result.deletion[:, 0], full)  # nothing deleted yet: the word as written
    torch.testing.assert_close(result.deletion[:, -1], empty)  # everything deleted
    torch.testing.assert_close(result.insertion[:, 0], empty)
    torch.testing.assert_close(result.insertion[:, -1], full)


def count_word(annotations: torch.Tensor, rows: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """A word whose probability grows with the first channel summed over the cells, weighted by cell:
    every deleted cell moves it, by its own amount."""
    weights = torch.arange(1, annotations.size(1) + 1, dtype=annotations.dtype)
    return torch.nn.functional.logsigmoid((annotations[..., 0] * weights).sum(-1) / 10 - 2)


@pytest.mark.parametrize("cells,steps", [(9, 4), (49, 10), (7, 3)])
def test_areas_integrate_over_the_true_shares_of_cells(cells: int, steps: int):
    torch.manual_seed(cells)
    annotations = torch.rand(1, cells, 2, dtype=torch.float64) + 0.5
    baseline = torch.zeros(2, dtype=torch.float64)
    maps = torch.rand(1, cells, dtype=torch.float64)  # distinct values: no ties
    words = torch.tensor([[0, 0]])
    result = method_curves(count_word, annotations, baseline, maps, words, CurveSettings(steps=steps))
    # by hand: after point k, the round(k P / steps) highest cells of the map are deleted
    order = sorted(range(cells), key=lambda p: -float(maps[0, p]))
    xs, ys = [], []
    for k in range(steps + 1):
        count = round(k * cells / steps)  # Python's round: half to even, as torch.round
        grid = annotations[0].clone()
        grid[order[:count]] = 0.0
        weighted = sum(float(grid[p, 0]) * (p + 1) for p in range(cells))
        xs.append(count / cells)
        ys.append(1 / (1 + np.exp(-(weighted / 10 - 2))))
    np.testing.assert_allclose(result.deletion[0].numpy(), ys, rtol=1e-9)
    expected = sum((xs[k + 1] - xs[k]) * (ys[k] + ys[k + 1]) / 2 for k in range(steps))
    assert result.deletion_area.item() == pytest.approx(expected, rel=1e-9)
    np.testing.assert_allclose(result.shares.numpy(), xs)


def test_ties_are_deleted_in_a_seeded_random_order_not_top_left_first():
    cells = P
    maps = torch.zeros(1, cells)
    maps[0, 3], maps[0, 6] = 5.0, 3.0  # two ranked cells, the rest tied at 0 (Grad-CAM's cut zeros)
    firsts_of_ties = []
    for seed in range(400):
        keys = torch.rand(1, cells, generator=torch.Generator().manual_seed(seed))
        order = ranked(maps, keys)[0].tolist()
        assert order[:2] == [3, 6]  # the map's order first
        assert sorted(order[2:]) == [0, 1, 2, 4, 5, 7]
        firsts_of_ties.append(order[2])
    counts = np.bincount(firsts_of_ties, minlength=cells)[[0, 1, 2, 4, 5, 7]]
    assert counts.min() > 400 / 6 * 0.6  # each tied cell comes first about equally often
    # through the curves: a flat map's deletion curve is the random control's, not raster order's
    annotations, baseline, words = image()
    flat = torch.zeros(1, P)
    means = np.mean(
        [
            method_curves(
                key_cell_word, annotations, baseline, flat, words, CurveSettings(steps=P, seed=seed)
            )
            .deletion[0]
            .numpy()
            for seed in range(300)
        ],
        axis=0,
    )
    k = np.arange(P + 1)
    np.testing.assert_allclose(means, EMPTY + (FULL - EMPTY) * (1 - k / P), atol=0.08)
    # the same seed gives the same order
    again = [
        method_curves(key_cell_word, annotations, baseline, flat, words, CurveSettings(steps=P, seed=7))
        for _ in range(2)
    ]
    torch.testing.assert_close(again[0].deletion, again[1].deletion)


def test_the_random_control_does_not_depend_on_the_batching():
    annotations = torch.rand(3, P, C, generator=torch.Generator().manual_seed(0))
    words = torch.tensor([[0, 0], [1, 0], [2, 0]])
    settings = CurveSettings(steps=4, random_seeds=2)

    def reads_cell_sum(grids, rows, indices):
        return torch.nn.functional.logsigmoid(grids[..., 0].cumsum(-1).sum(-1) / 10 - 1)

    together = random_curves(reads_cell_sum, annotations, torch.zeros(C), words, settings)
    alone = random_curves(
        reads_cell_sum, annotations[2:], torch.zeros(C), torch.tensor([[0, 0]]), settings, torch.tensor([2])
    )
    for seed in range(2):
        torch.testing.assert_close(together[seed].deletion[2:], alone[seed].deletion)
