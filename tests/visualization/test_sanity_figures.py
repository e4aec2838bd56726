"""The randomisation tests' figure: one panel per measure, one line per method, each line the method's
curve over the stages as the scores hold it (None drawn as a gap); the page section lists the stages and
the data randomisation rows."""

from __future__ import annotations

import numpy as np
import pytest

from captioning.visualization.sanity_figures import MEASURE_TITLES, sanity_section, stage_figure

STAGES = ["output layer", "deep output", "recurrence"]


def curves(offset: float) -> dict:
    return {
        measure: [1.0 - offset * k if k != 1 or measure != "hog" else None for k in range(len(STAGES))]
        for measure in MEASURE_TITLES
    }


def table() -> dict:
    return {
        "stages": STAGES,
        "parameters": {stage: [f"{stage}.weight"] for stage in STAGES},
        "words": 7,
        "cascading": {"attention": curves(0.0), "gradient": curves(0.4)},
        "flag": {"measure": "spearman_abs", "threshold": 0.5, "attention": True, "gradient": False},
    }


def test_one_panel_per_measure_and_one_line_per_method():
    figure = stage_figure(table())
    axes = figure.get_axes()
    assert [ax.get_title() for ax in axes] == list(MEASURE_TITLES.values())
    for ax, measure in zip(axes, MEASURE_TITLES, strict=True):
        lines = [line for line in ax.get_lines() if line.get_label() in ("attention", "gradient")]
        assert [line.get_label() for line in lines] == ["attention", "gradient"]
        for line, method in zip(lines, ("attention", "gradient"), strict=True):
            expected = [np.nan if v is None else v for v in table()["cascading"][method][measure]]
            np.testing.assert_array_equal(line.get_ydata(), expected)
        assert [tick.get_text() for tick in ax.get_xticklabels()] == STAGES
    with pytest.raises(ValueError, match="independent"):
        stage_figure(table(), "independent")


def test_the_page_section_holds_the_figures_stages_flag_and_data_test():
    scores = {
        "sanity": table(),
        "data_randomisation": {"words": 7, "methods": {"attention": dict.fromkeys(MEASURE_TITLES, 0.25)}},
    }
    section = sanity_section(scores)
    assert section is not None and len(section.figures) == 1  # cascading only
    assert section.stages == [(stage, f"{stage}.weight") for stage in STAGES]
    assert section.flag == ("spearman_abs", 0.5, ["attention"])
    assert section.data_rows == [("attention", ["0.250"] * 4)] and section.data_words == 7
    assert sanity_section({"methods": {}}) is None
