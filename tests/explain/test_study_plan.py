"""The plan a study prints before it runs: its passes counted by hand here, and within a few percent of
the rows the decoder really runs in the study."""

from __future__ import annotations

import pytest
import torch

from captioning.config import LSTMDecoderConfig
from captioning.explain import similarity
from captioning.explain.config import ExplainConfig
from captioning.explain.plan import calibrate, study_plan
from captioning.explain.sanity import randomisation_stages
from captioning.explain.study import faithfulness_study
from captioning.models.decoder import ShowAttendTellDecoder

pytestmark = pytest.mark.usefixtures("single_thread")

P, C = 6, 4
TOKENS = [[4, 7, 5], [6, 8], [9, 4, 10, 11]]


def decoder() -> ShowAttendTellDecoder:
    torch.manual_seed(0)
    config = LSTMDecoderConfig(embed_dim=8, hidden_dim=8, attention_dim=8, dropout=0.0)
    return ShowAttendTellDecoder.from_config(config, 12, C).eval()


def test_the_plan_counts_what_the_study_runs(monkeypatch):
    model = decoder()
    settings = ExplainConfig(ig_steps=3, curve_steps=4, random_seeds=2, sanity_images=2, batch_images=2)
    plan = study_plan(model, TOKENS, P, settings)
    words, images = 9, 3
    # by hand: attention 1 row per image; gradient, Grad-CAM one backward row per word, IG ig_steps;
    # occlusion P + 1 whole captions per image; curves 2 curves x 5 points per word and order
    assert plan.images == images and plan.words == words
    assert plan.backward_rows["explain"] == words * (1 + 3 + 1)
    assert plan.forward_rows["explain"] == images + 3 * images + images * (P + 1)
    assert plan.forward_rows["curves"] == words * 2 * 5 * (5 + 2)
    stages = 2 * len(randomisation_stages(model)) + 1  # trained, then cascading and independent
    sanity_words = 3 + 2
    assert plan.backward_rows["sanity"] == stages * sanity_words * 5
    assert plan.forward_rows["sanity"] == stages * (2 + 3 * 2 + 2 * (P + 1))
    lines = plan.lines()
    assert "3 images, 9 words, 5 methods" in lines[0] and f"{plan_total(plan):,} decoder rows" in lines[0]

    # the four measures: each stage's maps compared with the trained ones, which are the reference
    assert plan.similarity_words == stages * sanity_words * 5
    compared = []
    original = similarity.Reference.compare
    monkeypatch.setattr(
        similarity.Reference,
        "compare",
        lambda self, other: compared.append(len(other)) or original(self, other),
    )

    rows_run = []
    hook = model.register_forward_hook(lambda module, args, output: rows_run.append(args[1].size(0)))
    annotations = torch.rand(3, P, C, generator=torch.Generator().manual_seed(1))
    faithfulness_study(
        model,
        annotations,
        TOKENS,
        [["w"] * len(t) for t in TOKENS],
        [1, 2, 3],
        (2, 3),
        settings,
        torch.zeros(C),
        progress=False,
    )
    hook.remove()
    run = sum(rows_run)
    assert sum(compared) == (stages - 1) * sanity_words * 5
    # within a few rows: the methods' own passes are batched their way (a batch's captions per pass)
    assert abs(run - plan_total(plan)) <= 0.05 * plan_total(plan)

    calibrated = calibrate(plan, model, annotations, TOKENS, batch_rows=8)
    assert set(calibrated.seconds) == {"explain", "curves", "sanity"}
    assert all(seconds > 0 for seconds in calibrated.seconds.values())
    assert "expected time (estimate" in calibrated.lines()[1]
    passes_only = calibrated.seconds["sanity"]
    calibrated = calibrate(plan, model, annotations, TOKENS, batch_rows=8, similarity=((2, 3), 32))
    assert calibrated.seconds["sanity"] > passes_only  # the measures priced on top of the passes


def plan_total(plan) -> int:
    return sum(plan.forward_rows.values()) + sum(plan.backward_rows.values())
