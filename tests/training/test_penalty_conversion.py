"""The authors' ``alpha_c`` is ``lambda = alpha_c * N / P`` here, as docs/training.md and the COCO
configurations say.

The authors' ``capgen.py`` minimises ``mean_n(-log p(y_n)) + alpha_c * ((1 - alphas.sum(0)) ** 2)
.sum(0).mean()`` on (T, N, P) attention: the penalty summed over the batch's N captions and
averaged over the P positions. Per caption that is ``(1/N) * sum_n [-log p(y_n) + alpha_c * N / P *
penalty_n]``: equation 14 with ``lambda = alpha_c * N / P``.
"""

from __future__ import annotations

import re

import pytest
import torch
from tool_runs import REPO

from captioning.config.loading import load_config
from captioning.training.losses import doubly_stochastic_penalty


@pytest.mark.parametrize(("captions", "positions"), [(64, 196), (10, 49), (3, 81)])
def test_the_authors_objective_is_equation_14_with_alpha_c_times_n_over_p(captions, positions):
    generator = torch.Generator().manual_seed(captions)
    steps, alpha_c = 7, 1.0
    alphas = torch.rand(steps, captions, positions, generator=generator, dtype=torch.float64)
    alphas = alphas / alphas.sum(-1, keepdim=True)  # (T, N, P), each step's map sums to 1
    log_likelihood = -torch.rand(captions, generator=generator, dtype=torch.float64) * 30  # (N,)
    authors = (-log_likelihood).mean() + alpha_c * ((1.0 - alphas.sum(0)) ** 2).sum(0).mean()

    lam = alpha_c * captions / positions
    per_caption = alphas.permute(1, 0, 2)  # (N, T, P)
    mask = torch.ones(captions, steps, dtype=torch.bool)
    ours = ((-log_likelihood).sum() + lam * doubly_stochastic_penalty(per_caption, mask)) / captions
    assert float(ours) == pytest.approx(float(authors), rel=1e-12)


def test_the_coco_configurations_use_the_authors_converted_weight_and_the_docs_say_so():
    authors = 1.0 * 64 / 196  # their COCO script: alpha_c = 1, batch 64, a 14x14 grid
    for name in ("coco_resnet101", "coco_lite0", "coco_clip_vit"):
        config = load_config(REPO / "configs" / f"{name}.yaml")
        assert config.model.decoder.doubly_stochastic == pytest.approx(authors, abs=0.005), name
    text = (REPO / "docs" / "training.md").read_text()
    assert "λ = `alpha_c` · N / P" in text
    assert not re.search(r"use λ = 1, the value of the authors", text)
    for name in ("flickr8k", "flickr30k", "imagefolder"):
        assert "not the authors'" in (REPO / "configs" / f"{name}.yaml").read_text(), name
