"""The faithfulness page of a real ``evaluate.py --faithfulness`` run, and the run report of its
scores, opened in a real browser (Debian's chromium, headless): n, the intervals, the paired tests,
the per-class tables and the settings are visible, and each drawn image's figure of maps has loaded."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from browser import chromium
from tiny_models import tiny_checkpoint
from tool_runs import REPO, in_process

from captioning.data.shapes import ShapesFiles
from captioning.data.vocab import Vocabulary
from captioning.visualization.run_report import write_run_report

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("single_thread"),
    pytest.mark.skipif(
        not (shutil.which("chromium") and shutil.which("chromedriver")),
        reason="Debian's chromium and chromium-driver are not installed",
    ),
]


def browser(tmp_path: Path):
    return chromium(tmp_path, (1600, 1200))


def test_the_page_shows_n_intervals_and_the_per_class_table(
    tmp_path: Path, tiny_shapes: ShapesFiles, shapes_vocab: Vocabulary
):
    pytest.importorskip("selenium")
    import json

    from selenium.webdriver.common.by import By

    checkpoint = tiny_checkpoint(tmp_path / "run" / "best.pt", tiny_shapes.root, shapes_vocab, "lstm")
    scores_path = tmp_path / "scores.json"
    result = in_process(
        "evaluate.py",
        "--checkpoint", checkpoint, "--split", "test", "--no-java", "--no-progress",
        "--results", tmp_path / "results.json", "--out", scores_path,
        "--faithfulness", "attention,occlusion", "--curve-steps", "2", "--random-seeds", "3",
        "--sanity-images", "0", "--faithfulness-figures", "2", "--resamples", "300",
        cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    scores = json.loads(scores_path.read_text())
    table = scores["faithfulness"]
    report = write_run_report(tmp_path / "report.html", [], (2, 2), scores)  # as train.py's report.html
    driver = browser(tmp_path)
    try:
        driver.get(report.as_uri())
        row = driver.find_element(By.CSS_SELECTOR, '#faithfulness-methods tr[data-method="occlusion"]')
        low, high = table["methods"]["occlusion"]["insertion_auc_ci"]
        assert row.is_displayed() and f"[{low:.3f}, {high:.3f}]" in row.text
        assert driver.find_element(By.CSS_SELECTOR, "p.n").is_displayed()
        driver.get((tmp_path / "scores_faithfulness.html").as_uri())
        assert driver.find_element(By.CSS_SELECTOR, "p.n").is_displayed()
        words = table["statistics"]["words"]
        assert driver.find_element(By.CSS_SELECTOR, "p.n").text == f"n = 4 images, {words} words explained."
        methods = driver.find_element(By.ID, "faithfulness-methods")
        assert methods.is_displayed()
        headers = [th.text for th in methods.find_elements(By.CSS_SELECTOR, "thead th")]
        assert headers[:5] == [
            "method",
            "n images",
            "n words",
            "deletion area (lower: faithful)",
            "95% interval",
        ]
        for name in ("random order", "attention", "occlusion"):
            row = methods.find_element(By.CSS_SELECTOR, f'tr[data-method="{name}"]')
            cells = [td.text for td in row.find_elements(By.TAG_NAME, "td")]
            key = table["random"] if name == "random order" else table["methods"][name]
            low, high = key["deletion_auc_ci"]
            assert cells[1:5] == ["4", str(words), f"{key['deletion_auc']:.3f}", f"[{low:.3f}, {high:.3f}]"]
            assert row.is_displayed()
        seeds = driver.find_element(By.CSS_SELECTOR, "p.seeds").text
        assert "over 3 seeds" in seeds and "min" in seeds and "max" in seeds
        paired = driver.find_element(By.ID, "faithfulness-paired")
        assert paired.is_displayed() and len(paired.find_elements(By.CSS_SELECTOR, "tr.pair")) == 2
        assert "Holm over the 6 tests of the table" in driver.find_element(By.TAG_NAME, "body").text
        classes = driver.find_elements(By.CSS_SELECTOR, "table.word-class")
        shown = {c.get_attribute("data-class") for c in classes if c.is_displayed()}
        assert shown == {name for name, rows in table["by_word_class"].items() if rows} and shown
        for table_element in classes:
            for row in table_element.find_elements(By.CSS_SELECTOR, "tbody tr"):
                assert row.find_elements(By.TAG_NAME, "td")[4].text.startswith("[")  # its interval
        settings = driver.find_element(By.ID, "faithfulness-settings")
        assert settings.is_displayed() and "resamples" in settings.text and "curve_steps" in settings.text
        figures = driver.find_elements(By.CSS_SELECTOR, "img.methods")
        assert len(figures) == 2
        assert all(driver.execute_script("return arguments[0].naturalWidth", f) > 0 for f in figures)
    finally:
        driver.quit()
