"""The explanation tools end to end through the real commands on tiny runs: ``evaluate.py --faithfulness``
(the table in the scores, its settings in the signature), ``visualize.py --method`` and ``model.explain``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from bootstrap_reference import paired_test, percentile_interval
from tiny_models import tiny_checkpoint
from tool_runs import REPO, in_process

from captioning.data.shapes import ShapesFiles
from captioning.data.vocab import Vocabulary

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module", params=["lstm", "transformer"])
def run(
    request, tmp_path_factory: pytest.TempPathFactory, tiny_shapes: ShapesFiles, shapes_vocab: Vocabulary
):
    folder = tmp_path_factory.mktemp(f"run_{request.param}")
    return request.param, tiny_checkpoint(
        folder / "checkpoints" / "best.pt", tiny_shapes.root, shapes_vocab, request.param
    )


def test_evaluate_writes_the_faithfulness_table(tmp_path: Path, run, tiny_shapes: ShapesFiles):
    kind, checkpoint = run
    scores_path = tmp_path / "scores.json"
    result = in_process(
        "evaluate.py",
        "--checkpoint", checkpoint, "--split", "test", "--no-java", "--no-progress",
        "--results", tmp_path / "results.json", "--out", scores_path,
        "--faithfulness", "--ig-steps", "2", "--curve-steps", "2",
        "--random-seeds", "2", "--sanity-images", "2", "--faithfulness-figures", "2",
        "--resamples", "200", "--seed", "5",
        cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    scores = json.loads(scores_path.read_text())
    table = scores["faithfulness"]
    assert_intervals_of_the_images(table, 200, 5)
    expected = ["attention", "gradient", "integrated_gradients", "gradcam", "occlusion"]
    expected += ["rollout", "gradient_rollout", "chefer"] if kind == "transformer" else []
    assert list(table["methods"]) == expected
    assert table["images"] == 4
    for name in expected:
        row = table["methods"][name]
        assert 0 <= row["deletion_auc"] <= 1 and 0 <= row["insertion_auc"] <= 1
        assert row["deletion_gap"] == pytest.approx(table["random"]["deletion_auc"] - row["deletion_auc"])
        assert isinstance(row["sanity_flagged"], bool)
        assert row["grounding_mentions"] >= 0  # Shapes writes its boxes: grounding per method
        for measure in ("spearman", "spearman_abs", "ssim", "hog"):  # Adebayo et al.'s four, per stage
            for variant in ("cascading", "independent"):
                assert len(table["sanity"][variant][name][measure]) == len(table["sanity"]["stages"])
            assert row[f"sanity_{measure}"] == table["sanity"]["cascading"][name][measure][-1]
    assert table["sanity"]["stages"][0].startswith("output layer")  # top down
    assert table["sanity"]["size"] == 64  # the maps stretched to the model's images for SSIM and HOG
    if kind == "lstm":  # attention is computed before the output layer: unchanged by its re-draw
        assert table["sanity"]["cascading"]["attention"]["ssim"][0] == pytest.approx(1.0)
    assert set(table["by_word_class"]) == {"object", "attribute", "function", "other"}
    assert len(table["per_image"]) == 4
    assert "|faith:" + "+".join(expected) + ",ig2,steps2,seeds2,sanity2@0.5,n4" in scores["signature"]
    # the baseline by default: the training split's mean feature, named by its hash and kept in the run
    from captioning.explain.baselines import BASELINE_FILE, baseline_hash

    kept = json.loads((checkpoint.parents[1] / BASELINE_FILE).read_text())["mean"]
    assert (
        f",score=log_prob,baseline=dataset_mean.{baseline_hash(torch.tensor(kept))}," in scores["signature"]
    )
    assert table["baseline"] == f"dataset_mean.{baseline_hash(torch.tensor(kept))}"
    assert ",sim64px" in scores["signature"]
    assert "faithfulness of 4 images" in result.stdout and "integrated_gradients" in result.stdout
    # the run report shows the table beside the scores
    from captioning.visualization.run_report import write_run_report

    page = write_run_report(tmp_path / "report.html", [], (2, 2), scores).read_text(encoding="utf-8")
    assert_table_shown(page, table, expected)
    page_path = tmp_path / "scores_faithfulness.html"
    assert_faithfulness_page(page_path, result.stdout, table, tiny_shapes.root / "test", expected)


def assert_intervals_of_the_images(table: dict, resamples: int, seed: int) -> None:
    """The table's n, area intervals and gap tests equal an independent bootstrap of its per-image rows
    (each image's mean area times its words, resampled with them)."""
    rows = sorted(table["per_image"], key=lambda row: row["image_id"])
    words = [row["words"] for row in rows]
    assert table["statistics"]["words"] == sum(words) and table["statistics"]["images"] == len(rows)
    assert (table["statistics"]["resamples"], table["statistics"]["seed"]) == (resamples, seed)

    def sums(name: str, curve: str) -> list[float]:
        return [row[name][f"{curve}_auc"] * row["words"] for row in rows]

    for name, row in [("random", table["random"]), *table["methods"].items()]:
        assert (row["images"], row["words"]) == (len(rows), sum(words))
        for curve in ("deletion", "insertion"):
            expected = percentile_interval(sums(name, curve), words, resamples, seed)
            assert row[f"{curve}_auc_ci"] == pytest.approx(expected, abs=1e-6)
            if name != "random":
                a, b = sums(name, curve), sums("random", curve)
                a, b = (a, b) if curve == "deletion" else (b, a)
                difference, low, high, p = paired_test(a, b, words, resamples, seed)
                assert row[f"{curve}_gap"] == pytest.approx(difference, abs=1e-6)  # the row's gap: float32
                assert row[f"{curve}_gap_ci"] == pytest.approx([low, high], abs=1e-6)
                assert row[f"{curve}_gap_p"] == pytest.approx(p)
    methods = list(table["methods"])
    assert len(table["paired"]) == len(methods) * (len(methods) - 1)  # each pair, both curves
    for test in table["paired"]:
        a, b = sums(test["a"], test["curve"]), sums(test["b"], test["curve"])
        difference, low, high, p = paired_test(a, b, words, resamples, seed)
        found = (test["difference"], test["ci_low"], test["ci_high"])
        assert found == pytest.approx((difference, low, high), abs=1e-6)
        assert test["p_value"] == pytest.approx(p)


def assert_table_shown(page: str, table: dict, methods: list) -> None:
    """A page's faithfulness table: n, a row per method with its areas and their intervals, the paired
    tests, the per-class tables and the settings."""
    import re

    assert "Does the map explain the word? (4 images)" in page
    assert f"n = 4 images, {table['statistics']['words']} words explained" in page
    for name in methods:
        found = re.search(rf'<tr class="row" data-method="{name}">(.*?)</tr>', page, re.S)
        row = table["methods"][name]
        cells = re.findall(r"<td[^>]*>(.*?)</td>", found.group(1))
        low, high = row["deletion_auc_ci"]
        assert cells[0] == name + (
            " (this project's flag: barely changes with the model)" if row["sanity_flagged"] else ""
        )
        assert cells[1:5] == [
            "4",
            str(row["words"]),
            f"{row['deletion_auc']:.3f}",
            f"[{low:.3f}, {high:.3f}]",
        ]
    assert page.count('<tr class="pair">') == len(table["paired"])
    for word_class, rows in table["by_word_class"].items():
        assert (f'data-class="{word_class}"' in page) == bool(rows)
    assert "<dt>resamples</dt><dd>200</dd>" in page and "<dt>ig_steps</dt><dd>2</dd>" in page


def figure_height(picture, words: int, rows: int) -> int:
    """The pixel height of a method figure of ``rows`` methods as the faithfulness page draws it."""
    import io

    from PIL import Image

    from captioning.visualization.method_figures import method_figure

    maps = {f"m{k}": np.zeros((words, 1)) for k in range(rows)}
    buffer = io.BytesIO()
    method_figure(picture, ["w"] * words, maps, (1, 1), max_side=160).savefig(buffer, format="png", dpi=72)
    return Image.open(buffer).size[1]


def assert_faithfulness_page(page_path: Path, stdout: str, table: dict, images: Path, methods: list) -> None:
    """The page beside the scores: the table, and the first 2 explained test images, each with its
    figure of maps (one row per method) and its own areas per method."""
    import base64
    import html
    import io
    import re

    from PIL import Image

    assert re.search(r"faithfulness page\s+" + re.escape(str(page_path)), stdout)
    page = page_path.read_text(encoding="utf-8")
    assert_table_shown(page, table, methods)
    assert f"<dt>baseline</dt><dd>{table['baseline']}</dd>" in page  # what a removed cell held
    assert "<dt>explained score</dt><dd>log_prob</dd>" in page
    sanity = page.split('<section class="run" id="sanity">')[1].split("</section>")[0]
    assert sanity.count('<img class="sanity"') == 2  # cascading and independent: a figure each
    assert all(f"<tr><td>{html.escape(stage)}</td>" in sanity for stage in table["sanity"]["stages"])
    sections = re.findall(
        r'<section class="image" id="(img\d+)" data-image-id="(\d+)">(.*?)</section>', page, re.S
    )
    first_two = [row["image_id"] for row in table["per_image"][:2]]
    assert [int(image_id) for _, image_id, _ in sections] == first_two  # --faithfulness-figures 2
    for anchor, image_id, section in sections:
        assert f'href="#{anchor}"' in page  # the list of images opens each one
        name = re.search(r"<h3>(.*?):", section).group(1)
        picture = Image.open(images / name)  # a test image of the split
        figure = re.search(
            r'alt="maps of each word, one row per method: ([^"]*)" src="data:image/jpeg;base64,([^"]+)"',
            section,
        )
        assert figure.group(1).split(", ") == methods
        drawn = Image.open(io.BytesIO(base64.b64decode(figure.group(2))))
        # one row per method: a figure of one row, plus a row's height (two rows' less one's) per method
        words = len(re.search(r"<h3>.*?: (.*?)</h3>", section).group(1).split())
        one, two = figure_height(picture, words, 1), figure_height(picture, words, 2)
        assert abs(drawn.size[1] - (one + (len(methods) - 1) * (two - one))) < (two - one) / 2
        areas = dict(
            re.findall(r'<tr class="method"><td>(\w+)</td><td class="number">([\d.]+)</td>', section)
        )
        row = next(r for r in table["per_image"] if r["image_id"] == int(image_id))
        assert areas == {name: f"{row[name]['deletion_auc']:.3f}" for name in [*methods, "random"]}


def test_the_randomisation_tests_without_scikit_image_are_refused_before_any_work(
    tmp_path: Path, run, monkeypatch
):
    kind, checkpoint = run
    monkeypatch.setitem(sys.modules, "skimage", None)  # as Python blocks an import: not installed
    arguments = ["--checkpoint", checkpoint, "--split", "test", "--no-java", "--no-progress"]
    arguments += ["--results", tmp_path / "results.json", "--faithfulness", "attention"]
    refused = in_process("evaluate.py", *arguments, "--sanity-images", "2", cwd=REPO)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert all(name in refused.stderr for name in ("--sanity-images", "skimage", ".[explain]"))
    assert not (tmp_path / "results.json").exists()  # nothing decoded


def test_a_method_that_does_not_fit_is_refused_before_any_work(tmp_path: Path, run):
    kind, checkpoint = run
    arguments = ["--checkpoint", checkpoint, "--split", "test", "--no-java", "--no-progress"]
    unknown = in_process("evaluate.py", *arguments, "--faithfulness", "attention,lime", cwd=REPO)
    assert unknown.returncode == 2 and "unknown attribution method 'lime'" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1
    if kind == "lstm":
        refused = in_process("evaluate.py", *arguments, "--faithfulness", "rollout", cwd=REPO)
        assert refused.returncode == 2 and "rollout: explains a Transformer" in refused.stderr
    assert not (checkpoint.parents[1] / "eval_best_test_results.json").exists()
    scoring_a_file = in_process(
        "evaluate.py", "--annotations", "refs.json", "--results", "results.json", "--faithfulness", cwd=REPO
    )
    assert (
        scoring_a_file.returncode == 2
        and "--faithfulness explains the captions of a split" in scoring_a_file.stderr
    )


@pytest.mark.parametrize(
    "resamples, seed, needle",
    [
        ("0", "0", "--resamples"),
        ("10", "-1", "--seed"),
        ("100000000000", "0", "--resamples: 100000000000 resamples"),
    ],
    ids=["no-resamples", "negative-seed", "beyond-memory"],
)
def test_the_bootstrap_of_the_study_is_checked_before_decoding(tmp_path: Path, run, resamples, seed, needle):
    from messages import assert_naming

    _, checkpoint = run
    result = in_process(
        "evaluate.py", "--checkpoint", checkpoint, "--split", "test", "--no-java", "--no-progress",
        "--results", tmp_path / "results.json", "--out", tmp_path / "scores.json",
        "--faithfulness", "attention", "--resamples", resamples, "--seed", seed,
        cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert_naming(result.stderr.strip().splitlines()[-1], "error: ", needle)
    assert not (tmp_path / "results.json").exists()  # refused before any caption was decoded


def test_model_explain_gives_maps_and_curves(run, tiny_shapes: ShapesFiles):
    import captioning

    kind, checkpoint = run
    model = captioning.load(checkpoint, device="cpu")
    images = sorted((tiny_shapes.root / "test").glob("*.png"))[:2]
    methods = ["attention", "occlusion"] + (["rollout"] if kind == "transformer" else [])
    explanations = model.explain(images, methods=methods, curve_steps=2)
    captions = model.caption(images)
    assert len(explanations) == 2
    for explanation, caption in zip(explanations, captions, strict=True):
        words = len(caption.words)
        assert explanation.caption.words == caption.words
        assert set(explanation.maps) == set(methods)
        for name in methods:
            assert explanation.maps[name].shape == (words, *model.grid)
            assert explanation.curves.deletion[name].shape == (words, 3)
            # nothing removed yet and everything inserted: the same grid, the same probability
            np.testing.assert_allclose(
                explanation.curves.deletion[name][:, 0], explanation.curves.insertion[name][:, -1], rtol=1e-5
            )
            # numpy throughout: maps, curves, areas and the points' shares
            for value in (
                explanation.maps[name],
                explanation.curves.deletion[name],
                explanation.curves.insertion[name],
                explanation.curves.deletion_auc[name],
                explanation.curves.insertion_auc[name],
                explanation.curves.shares,
            ):
                assert isinstance(value, np.ndarray), type(value)
            assert explanation.curves.deletion_auc[name].round(3).shape == (words,)
        # the attention of the teacher-forced caption is the attention it was written with
        np.testing.assert_allclose(explanation.maps["attention"], caption.attention, atol=1e-5)
    with pytest.raises(captioning.utils.errors.CaptioningError):
        model.explain(images, methods="nonexistent")


def test_visualize_draws_one_row_per_method(tmp_path: Path, run, tiny_shapes: ShapesFiles):
    kind, checkpoint = run
    methods = "attention,gradcam" + (",chefer" if kind == "transformer" else "")
    result = in_process(
        "visualize.py", "--checkpoint", checkpoint, "--split", "test", "--num", "2",
        "--set", f"data.root={tiny_shapes.root}",
        "--method", methods, "--out-dir", tmp_path / "figures", "--no-progress",
        cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    figures = sorted((tmp_path / "figures").glob("*.png"))
    assert len(figures) == 2 and str(figures[0]) in result.stdout
    from PIL import Image

    one_row = in_process(
        "visualize.py", "--checkpoint", checkpoint, "--split", "test", "--num", "1",
        "--set", f"data.root={tiny_shapes.root}",
        "--method", "attention", "--out-dir", tmp_path / "one", "--no-progress",
        cwd=REPO,
    )  # fmt: skip
    assert one_row.returncode == 0, one_row.stderr
    rows = len(methods.split(","))
    tall, short = Image.open(figures[0]).size[1], Image.open(next((tmp_path / "one").glob("*.png"))).size[1]
    assert tall > (rows - 0.5) * short  # a row per method
    refused = in_process(
        "visualize.py", "--checkpoint", checkpoint, "--split", "test", "--method", "attention,nothing",
        "--out-dir", tmp_path / "never", cwd=REPO,
    )  # fmt: skip
    assert refused.returncode == 2 and "unknown attribution method 'nothing'" in refused.stderr
    assert not (tmp_path / "never").exists()


def test_method_figure_statistics_and_scale():
    from PIL import Image

    from captioning.explain.plausibility import normalised
    from captioning.utils.shares import positive_shares
    from captioning.visualization.method_figures import method_figure

    maps = {"a": np.array([[1.0, 0.0, 0.0, 0.0], [-1.0, 2.0, 2.0, 0.0]]), "b": np.zeros((2, 4))}
    np.testing.assert_allclose(positive_shares(maps["a"]), [[1, 0, 0, 0], [0, 0.5, 0.5, 0]])
    np.testing.assert_allclose(positive_shares(maps["b"]), np.full((2, 4), 0.25))  # nothing positive: uniform
    np.testing.assert_allclose(normalised(maps["a"]), [[1 / 5, 0, 0, 0], [0, 2 / 5, 2 / 5, 0]])  # one map
    figure = method_figure(Image.new("RGB", (40, 30)), ["a", "b"], maps, (2, 2))
    texts = [text.get_text() for ax in figure.axes for text in ax.texts]
    # the peak in the colours' units (the map's largest value), the entropy of its positive part's shares
    assert "peak 1 \u00b7 H 0.00 (1.0 cells)" in texts and "peak 2 \u00b7 H 0.69 (2.0 cells)" in texts
    bars = [ax for ax in figure.axes if not ax.images]
    # one colour bar per row from 0: row a tops at 4 x its even spread (4 over 4 cells), above its
    # largest value 2 (overlay.scale_top); an all-zero row: 0 to 1
    assert sorted(tuple(ax.get_ylim()) for ax in bars) == [(0.0, 1.0), (0.0, 4.0)]
    with pytest.raises(ValueError, match="3 maps for 2 words"):
        method_figure(Image.new("RGB", (40, 30)), ["a", "b"], {"c": np.zeros((3, 4))}, (2, 2))


def test_compare_bootstraps_the_faithfulness_rows(tmp_path: Path):
    ids = list(range(1, 21))
    refs = {
        "images": [{"id": i} for i in ids],
        "annotations": [{"image_id": i, "caption": "a red circle"} for i in ids],
    }
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    for name, deletion in (("a", 0.2), ("b", 0.5)):  # B's occlusion maps delete worse on every image
        (tmp_path / f"{name}_results.json").write_text(
            json.dumps([{"image_id": i, "caption": "a red circle"} for i in ids])
        )
        rng = np.random.default_rng(len(name))
        per_image = [
            {
                "image_id": i,
                "random": {"deletion_auc": 0.6, "insertion_auc": 0.4},
                "occlusion": {"deletion_auc": deletion + 0.05 * rng.standard_normal(), "insertion_auc": 0.7},
            }
            for i in ids
        ]
        table = {"methods": {"occlusion": {}}, "per_image": per_image}
        (tmp_path / f"{name}_scores.json").write_text(json.dumps({"faithfulness": table}))
    out = tmp_path / "comparison.json"
    result = in_process(
        "evaluate.py", "--compare", tmp_path / "a_results.json", tmp_path / "b_results.json",
        "--annotations", tmp_path / "refs.json", "--no-java", "--resamples", "200", "--out", out,
        cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "faithfulness of the maps, 20 images explained by both" in result.stdout
    rows = json.loads(out.read_text())["faithfulness"]
    assert set(rows) == {"occlusion deletion", "occlusion insertion", "random deletion", "random insertion"}
    deletion = rows["occlusion deletion"]
    assert deletion["difference"] == pytest.approx(0.3, abs=0.05) and deletion["p_value"] < 0.05
    assert rows["random deletion"]["difference"] == pytest.approx(0.0)


def test_the_demo_draws_a_method_beside_attention(run, tiny_shapes: ShapesFiles):
    import captioning
    from captioning.cli.serve import caption_file

    _, checkpoint = run
    model = captioning.load(checkpoint, device="cpu")
    image = str(sorted((tiny_shapes.root / "test").glob("*.png"))[0])
    text, attention_only, overlays = caption_file(model, image, "beam", 2)
    same, beside, same_overlays = caption_file(model, image, "beam", 2, method="gradcam")
    assert same == text and len(same_overlays) == 2 * len(overlays)  # each word: attention, then gradcam
    assert [title for _, title in same_overlays[::2]] == [title for _, title in overlays]
    assert [title for _, title in same_overlays[1::2]] == [
        f"{w}: gradcam" for w in model.caption([image])[0].words
    ]
    assert beside.size != attention_only.size  # the two-row figure of visualize.py --method attention,gradcam


@pytest.mark.slow
def test_a_method_of_ones_own_reaches_the_tools_through_import(tmp_path: Path, run, tiny_shapes: ShapesFiles):
    """The example of docs/extending.md, through the real command in its own process."""
    from tool_runs import run_tool

    _, checkpoint = run
    page = (REPO / "docs" / "extending.md").read_text(encoding="utf-8")
    example = page.split("# my_methods.py\n")[1].split("```")[0]
    (tmp_path / "my_methods.py").write_text(example)
    result = run_tool(
        "visualize.py", "--import", tmp_path / "my_methods.py", "--checkpoint", checkpoint, "--split", "test",
        "--num", "1", "--set", f"data.root={tiny_shapes.root}", "--method", "attention,squared_gradient",
        "--out-dir", tmp_path / "figures", "--no-progress",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert len(list((tmp_path / "figures").glob("*.png"))) == 1


def test_method_figure_outlines_each_words_boxes_on_every_methods_row():
    from matplotlib.patches import Rectangle
    from PIL import Image

    from captioning.visualization.method_figures import method_figure

    maps = {"attention": np.ones((2, 4)), "occlusion": np.zeros((2, 4))}
    boxes = [[], [(100.0, 40.0, 60.0, 20.0)]]  # the second word names one object
    figure = method_figure(
        Image.new("RGB", (320, 160)), ["red", "circle"], maps, (2, 2), max_side=160, boxes=boxes
    )
    panels = [ax for ax in figure.axes if ax.images]  # per row: the image, then a panel per word
    assert len(panels) == 6
    for row in range(2):
        image, red, circle = panels[3 * row : 3 * row + 3]
        assert not image.patches and not red.patches
        (box,) = [p for p in circle.patches if isinstance(p, Rectangle)]
        assert box.get_xy() == pytest.approx((50.0, 20.0))  # drawn at 160 x 80: half the pixels
        assert (box.get_width(), box.get_height()) == pytest.approx((30.0, 10.0))
    with pytest.raises(ValueError, match="1 lists of boxes for 2 words"):
        method_figure(Image.new("RGB", (40, 30)), ["a", "b"], maps, (2, 2), boxes=[[]])
