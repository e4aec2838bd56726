"""The run report: configuration, checkpoint and signature, scores with grounding and CHAIR, curves per
epoch, and a table of images that sorts by each per-image score and opens each image's attention
(driven in headless Chromium through Selenium)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from browser import chromium, needs_chromium
from PIL import Image
from test_visualization import GRID, captioned_item, one_hot

from captioning.evaluation.grounding import Instances, ObjectBox
from captioning.visualization.faithfulness_table import PLAUSIBILITY
from captioning.visualization.run_report import (
    curve_keys,
    curve_panels,
    curves_figure,
    curves_png,
    write_run_report,
)

HISTORY = [
    {
        "stage": "xe",
        "epoch": 1,
        "train_loss": 3.2,
        "train_cross_entropy": 3.0,
        "val_CIDEr-D": 0.21,
        "lr": 1e-3,
    },
    {
        "stage": "xe",
        "epoch": 2,
        "train_loss": 2.6,
        "train_cross_entropy": 2.5,
        "val_CIDEr-D": 0.43,
        "lr": 1e-3,
    },
    {"stage": "scst", "epoch": 1, "train_reward": 0.5, "val_CIDEr-D": 0.52, "lr": 1e-5},
]
# image id -> (CIDEr-D, grounding mass, CHAIR-i); image 12 has no boxes, so no grounding or CHAIR.
PER_IMAGE = {10: (0.9, 0.2, 0.0), 11: (0.1, 0.8, 0.5), 12: (0.5, None, None), 13: (1.4, 0.5, 1.0)}


@pytest.fixture
def run_items(tmp_path: Path):
    picture = tmp_path / "grey.png"
    Image.new("RGB", (60, 40), (128, 128, 128)).save(picture)
    items = [
        captioned_item(
            picture,
            image_id,
            ["a", "red", "circle"],
            torch.cat([torch.full((1, 49), 1 / 49), one_hot(GRID, (1, 1), (2, 2))]),
        )
        for image_id in PER_IMAGE
    ]
    per_image = []
    for image_id, (cider, mass, chair_i) in PER_IMAGE.items():
        entry = {"image_id": image_id, "CIDEr-D": cider}
        if mass is not None:
            entry.update(
                {
                    "grounding-mass": mass,
                    "grounding-pointing": 1.0,
                    "grounding-words": 1,
                    "CHAIR-i": chair_i,
                    "CHAIR-s": float(chair_i > 0),
                    "CHAIR-mentions": 2,
                    "hallucinated": ["square"] * int(2 * chair_i),
                }
            )
        per_image.append(entry)
    scores = {
        "CIDEr-D": 0.725,
        "grounding-mass": 0.5,
        "grounding-pointing": 1.0,
        "grounding-words": 3,
        "grounding-images": 3,
        "CHAIR-i": 0.5,
        "CHAIR-s": 0.67,
        "CHAIR-mentions": 6,
        "CHAIR-hallucinated": 3,
        "CHAIR-images": 3,
        "signature": "refs:abc|n:4|tok:python|ckpt:1234",
        "table": "metric  x100\nCIDEr-D  72.50",
        "per_image": per_image,
    }
    boxes = Instances(
        {i: (60.0, 40.0) for i in PER_IMAGE},
        {i: [ObjectBox("circle", (5, 5, 20, 20), {"color": "red"})] for i in PER_IMAGE},
    )
    return items, scores, boxes


def test_report_holds_config_scores_curves_and_a_row_per_image(tmp_path, run_items):
    items, scores, boxes = run_items
    path = write_run_report(
        tmp_path / "report.html",
        items,
        GRID,
        scores,
        config_text="train:\n  seed: 3 # <b>\n",
        checkpoint=tmp_path / "best.pt",
        history=HISTORY,
        boxes=boxes,
        total_images=9,
    )
    page = path.read_text(encoding="utf-8")
    assert "seed: 3 # &lt;b&gt;" in page and str(tmp_path / "best.pt") in page
    assert "refs:abc|n:4|tok:python|ckpt:1234" in page and "CIDEr-D  72.50" in page
    assert "grounding: attention mass in the named object&#x27;s box 0.500" in page
    assert "object hallucination: CHAIR-i 0.5000" in page and "9 scored, 4 shown below" in page
    assert 'alt="training and validation curves per epoch" src="data:image/png;base64,' in page
    assert "<th>train_loss</th>" in page and "<th>val_CIDEr-D</th>" in page and 'data-value="0.43"' in page
    assert len(re.findall(r'<tr data-index="\d+">', page)) == 4
    assert (
        "image 11 &middot; CIDEr-D 0.100, grounding mass 0.800, pointing (strict) 1.000, "
        "CHAIR-i 0.500, CHAIR-s 1.000" in page
    )
    assert "image 12 &middot; CIDEr-D 0.500</h2>" in page
    # rows worst first by CIDEr-D (images 11, 12, 10, 13 are items 1, 2, 0, 3)
    assert re.findall(r'<tr data-index="(\d+)">', page) == ["1", "2", "0", "3"]
    assert "<th>hallucinated</th>" in page and "square, square" in page
    # each image's section shows the image itself beside the one under its attention maps
    assert page.count('<img class="plain" ') == 4 and page.count('<img class="photo" ') == 4
    assert "http://" not in page and "https://" not in page and "<link" not in page  # nothing fetched


def test_each_panel_holds_one_quantity_on_one_scale():
    """The self-critical loss (a surrogate, often negative) never shares the cross-entropy axis; the
    penalty is drawn weighted, and not at all when its weight is 0; CIDEr-D (0-10) and BLEU (0-1) apart."""
    history = [
        {
            "stage": "xe",
            "epoch": 1,
            "train_loss": 3.0,
            "train_cross_entropy": 3.0,
            "train_attention_penalty": 1.7,
            "val_CIDEr-D": 0.4,
            "val_BLEU-4": 0.1,
        },
        {
            "stage": "xe",
            "epoch": 2,
            "train_loss": 2.5,
            "train_cross_entropy": 2.5,
            "train_attention_penalty": 1.6,
            "val_CIDEr-D": 0.9,
            "val_BLEU-4": 0.2,
        },
        {
            "stage": "scst",
            "epoch": 1,
            "train_loss": -0.4,
            "train_reward": 0.8,
            "val_CIDEr-D": 1.2,
            "val_BLEU-4": 0.3,
        },
    ]
    panels = dict(curve_panels(history, penalty_weight=0.0))
    assert panels["cross-entropy stage: loss"] == [
        ("loss", "train_loss", "xe"),
        ("cross_entropy", "train_cross_entropy", "xe"),
    ]
    assert panels["self-critical stage: loss and reward"] == [
        ("loss", "train_loss", "scst"),
        ("reward", "train_reward", "scst"),
    ]
    assert panels["validation CIDEr-D"] == [("CIDEr-D", "val_CIDEr-D", None)]
    assert panels["validation scores in [0, 1]"] == [("BLEU-4", "val_BLEU-4", None)]
    assert not any("penalty" in title for title in panels)  # lambda 0: the loss holds no penalty
    weighted = dict(curve_panels(history, penalty_weight=0.33))
    assert weighted["attention penalty, as weighted in the loss"] == [
        ("0.33 x attention penalty", "weighted_penalty", "xe")
    ]
    assert not any("penalty" in title for title in curve_panels(history))  # read from the history: loss == ce
    assert curves_png(history, 0.33).startswith(b"\x89PNG")


def test_curves_leave_out_what_is_not_a_curve():
    assert curve_keys(HISTORY) == ["train_loss", "train_cross_entropy", "val_CIDEr-D", "train_reward"]
    assert curves_png(HISTORY).startswith(b"\x89PNG") and curves_png([]) == b""


@pytest.mark.slow  # a browser
@needs_chromium
def test_table_sorts_worst_first_and_an_image_opens(tmp_path, run_items):
    from selenium.webdriver.common.by import By

    items, scores, boxes = run_items
    path = write_run_report(tmp_path / "report.html", items, GRID, scores, history=HISTORY, boxes=boxes)
    driver = chromium(tmp_path, (1000, 800))
    try:
        driver.get(path.as_uri())

        def order() -> list[str]:
            return [
                row.find_element(By.TAG_NAME, "a").get_attribute("href").rsplit("#", 1)[1]
                for row in driver.find_elements(By.CSS_SELECTOR, "table.images tbody tr")
            ]

        def click(header: str) -> None:
            driver.find_element(By.XPATH, f"//table[@class='images']//th/button[text()='{header}']").click()

        ids = list(PER_IMAGE)  # item k shows image ids[k]
        # the page opens worst first by CIDEr-D, as a first click sorts
        assert order() == [f"img{ids.index(i)}" for i in (11, 12, 10, 13)]
        header = driver.find_element(By.XPATH, "//table[@class='images']//th[button[text()='CIDEr-D']]")
        assert header.get_attribute("aria-sort") == "ascending"
        click("CIDEr-D")  # then best first
        assert order() == [f"img{ids.index(i)}" for i in (13, 10, 12, 11)]
        click("CIDEr-D")  # and worst first again
        assert order() == [f"img{ids.index(i)}" for i in (11, 12, 10, 13)]
        click("CHAIR-i")  # worst first: most hallucination; image 12 without boxes last
        assert order() == [f"img{ids.index(i)}" for i in (13, 11, 10, 12)]
        click("grounding mass")
        assert order() == [f"img{ids.index(i)}" for i in (10, 13, 11, 12)]

        sections = driver.find_elements(By.CSS_SELECTOR, "section.item")
        assert len(sections) == 4 and not any(section.is_displayed() for section in sections)
        driver.find_element(By.CSS_SELECTOR, 'table.images a[href="#img1"]').click()
        assert [section.is_displayed() for section in sections] == [False, True, False, False]
        word = sections[1].find_elements(By.CSS_SELECTOR, "a.word")[2]
        assert "peak 1.00" in word.get_attribute("title")
        word.click()  # its map is shown over the picture, the others hidden
        maps = sections[1].find_elements(By.CSS_SELECTOR, "img.map")
        assert [m.value_of_css_property("visibility") for m in maps] == ["hidden", "hidden", "visible"]
        driver.get(path.as_uri() + "#img3-w1")  # a word's fragment opens its image too
        assert [
            section.is_displayed() for section in driver.find_elements(By.CSS_SELECTOR, "section.item")
        ] == [False, False, False, True]
    finally:
        driver.quit()


def test_without_object_annotations_the_hallucinated_column_is_left_out_and_said_why(tmp_path, run_items):
    items, scores, _ = run_items
    plain = [{"image_id": entry["image_id"], "CIDEr-D": entry["CIDEr-D"]} for entry in scores["per_image"]]
    page = write_run_report(tmp_path / "r.html", items, GRID, {**scores, "per_image": plain}).read_text()
    assert "<th>hallucinated</th>" not in page
    assert (
        'No "hallucinated" column: CHAIR names the objects a caption invents from the images\' object' in page
    )
    assert (
        len(
            re.findall(
                r'<tr data-index="\d+"><td><a href="#img\d+">grey.png</a></td><td>a red circle</td>'
                r'<td class="number" data-value="[\d.]+">[\d.]+</td></tr>',
                page,
            )
        )
        == 4
    )


def test_curves_that_coincide_both_show_and_a_stage_panel_spans_its_epochs():
    history = [
        {
            "stage": "xe",
            "epoch": e,
            "train_loss": 3.0 - e / 10,
            "val_BLEU-4": 0.1 * e,
            "val_BLEU-4 (NLTK corpus)": 0.1 * e,
        }
        for e in range(1, 17)
    ] + [{"stage": "scst", "epoch": e, "train_loss": -0.1, "train_reward": 0.5 + e / 10} for e in (1, 2)]
    figure = curves_figure(history)
    panels = {ax.get_title(): ax for ax in figure.axes}
    scores = panels["validation scores in [0, 1]"]
    bleu, nltk = [line for line in scores.get_lines() if not line.get_label().startswith("_")]
    assert (bleu.get_ydata() == nltk.get_ydata()).all()  # the same numbers, drawn two ways
    assert (bleu.get_linestyle(), bleu.get_marker()) != (nltk.get_linestyle(), nltk.get_marker())
    assert nltk.get_markerfacecolor() == "none"  # a hollow marker shows the one under it
    assert scores.get_xlim() == (0.5, 18.5)
    assert panels["self-critical stage: loss and reward"].get_xlim() == (16.5, 18.5)  # its 2 epochs
    assert panels["cross-entropy stage: loss"].get_xlim() == (0.5, 16.5)


@pytest.mark.slow  # a browser
@needs_chromium
def test_the_scores_block_stays_inside_the_page(tmp_path, run_items):
    """A long scores line (a signature, a wide table) scrolls inside its block, in a real browser: the
    page itself never grows wider than the window, and the block's right edge stays inside it."""

    items, scores, boxes = run_items
    methods = {
        name: {
            **{f"{curve}_{part}": 0.123456 for curve in ("deletion", "insertion") for part in ("auc", "gap")},
            **{key: 0.123456 for key, _ in PLAUSIBILITY},
            "images": 4,
            "words": 12,
        }
        for name in ("attention", "integrated_gradients (flagged: barely changes)", "gradient_rollout")
    }
    faithfulness = {"images": 4, "random": {"deletion_auc": 0.5, "insertion_auc": 0.5}, "methods": methods}
    wide = {
        **scores,
        "table": "metric " + "  ".join(f"column-{k}: 0.{k:03d}" for k in range(60)),
        "faithfulness": faithfulness,
    }
    path = write_run_report(tmp_path / "report.html", items, GRID, wide, history=HISTORY, boxes=boxes)
    driver = chromium(tmp_path, (800, 700))
    try:
        driver.get(path.as_uri())
        measured = driver.execute_script(
            """
            const block = document.querySelector('#scores pre');
            const section = document.querySelector('#scores');
            const table = document.querySelector('#scores table.faithfulness');
            return {page: document.documentElement.scrollWidth, window: document.documentElement.clientWidth,
                    right: block.getBoundingClientRect().right, scroll: block.scrollWidth,
                    client: block.clientWidth, overflow: getComputedStyle(block).overflowX,
                    section: section.getBoundingClientRect().right,
                    sectionScroll: section.scrollWidth, sectionClient: section.clientWidth,
                    sectionOverflow: getComputedStyle(section).overflowX,
                    table: table.scrollWidth};
            """
        )
    finally:
        driver.quit()
    assert measured["scroll"] > measured["client"]  # the line is wider than the block ...
    assert measured["overflow"] in ("auto", "scroll")  # ... which scrolls
    assert measured["right"] <= measured["window"]  # and stays inside the window
    assert measured["page"] <= measured["window"]  # the page does not scroll sideways
    # the faithfulness table, wider than the window, scrolls inside the block too
    assert measured["table"] > measured["window"] and measured["section"] <= measured["window"]
    assert measured["sectionScroll"] > measured["sectionClient"]
    assert measured["sectionOverflow"] in ("auto", "scroll")
