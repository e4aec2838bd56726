"""The export check every decoder family goes through: its three decoder graphs written by
``export_decoder_graphs``, stepped by ONNX Runtime as the PyTorch decoder steps (outputs and next
state), and the NumPy search over them giving the PyTorch search's captions.

``check_export(decoder, annotations, folder)`` is the whole check; the export tests call it for every
registered family, and a family registered in a test (the GRU of ``tests/models/gru_family.py``)
calls the same function.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from search_options import settings
from tiny_models import tiny_decoder_config

from captioning.config import DecodeConfig
from captioning.export.beam import beam_search as numpy_beam
from captioning.export.graphs import export_decoder_graphs, flatten
from captioning.export.runtime import Graph, OnnxNetworks, Preprocessing
from captioning.export.search import greedy_search as numpy_greedy
from captioning.export.search import sample_captions as numpy_sample
from captioning.models import decoding
from captioning.models.base import CaptionDecoder
from captioning.models.captioner import build_decoder

C, GRID, V = 12, (3, 3), 13  # annotation channels, grid, vocabulary
P = GRID[0] * GRID[1]

# The searches the whole check compares (the NumPy search tests run every option).
CHECKED_SEARCHES = {
    "greedy": settings(strategy="greedy", max_length=7),
    "beam 3, two returned": settings(beam_size=3, num_return=2, max_length=6),
    "diverse beam 4 in 2 groups": settings(beam_size=4, beam_groups=2, diversity=0.8, max_length=6),
    "sample, two returned": settings(strategy="sample", num_return=2, max_length=6),
}


def random_decoder(kind: str, gain: float = 2.0, **options) -> CaptionDecoder:
    """A seeded random decoder of the family ``kind`` at its tiny sizes (``tiny_decoder_config``, with
    ``options``), in eval mode, its parameters scaled by ``gain`` so that the words depend on the image."""
    torch.manual_seed(0)
    decoder = build_decoder(tiny_decoder_config(kind, **options), V, C, GRID).eval()
    with torch.no_grad():
        for parameter in decoder.parameters():
            parameter.mul_(gain)
    return decoder


def grids(batch: int = 3) -> torch.Tensor:
    """(B, P, C) annotation grids."""
    return torch.randn(batch, P, C, generator=torch.Generator().manual_seed(1))


def exported_networks(decoder: CaptionDecoder, annotations: torch.Tensor, folder: Path) -> OnnxNetworks:
    """``decoder``'s graphs written into ``folder`` (traced on the first two images), as the runtime
    reads them."""
    layout = export_decoder_graphs(decoder, annotations[:2], folder)
    step_inputs = ["tokens", *layout.prepared_names(), *layout.state_names()]
    graphs = (
        None,  # no encoder: the grids are given
        Graph(folder / "decoder_prepare.onnx", ["annotations"], layout.prepared_names(), 1),
        Graph(folder / "decoder_init.onnx", ["annotations"], layout.state_names(), 1),
        Graph(folder / "decoder_step.onnx", step_inputs, layout.step_outputs(), 1),
    )
    preprocessing = Preprocessing(8, "bilinear", (0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    return OnnxNetworks(graphs, layout, preprocessing, GRID, C, V)  # type: ignore[arg-type]


def _close(got: np.ndarray, want: torch.Tensor, what: str) -> None:
    """Equal within float32 rounding: 1e-5 absolute, and relative for large values (logits)."""
    np.testing.assert_allclose(got, want.float().numpy(), atol=1e-5, rtol=1e-5, err_msg=what)


def assert_graphs_step_as_torch(
    decoder: CaptionDecoder, networks: OnnxNetworks, annotations: torch.Tensor, steps: int = 4
) -> None:
    """The graphs' initial state, and over ``steps`` words the logits, alpha, beta and next state, equal
    PyTorch's within 1e-5 (absolute and relative): on more images than traced, two rows per image,
    random words, and the rows of each image swapped between steps as beam search reorders them."""
    batch, group = annotations.size(0), 2
    rows = torch.arange(batch).repeat_interleave(group)  # (N,) image-major
    swapped = (rows * group + torch.tensor([1, 0]).repeat(batch)).numpy()  # each image's two rows swapped
    generator = torch.Generator().manual_seed(2)
    tokens = torch.full((rows.numel(),), decoding.START, dtype=torch.long)
    with torch.no_grad():
        prepared = decoder.prepare(annotations)._replace(group=group)
        state = decoder.init_state(annotations).select(rows)
        arrays = networks.prepare(annotations.numpy())
        onnx_state = tuple(array[rows.numpy()] for array in networks.init_state(annotations.numpy()))
        assert len(onnx_state) == len(flatten(state)) > 0
        for got, want in zip(onnx_state, flatten(state), strict=True):
            _close(got, want, "initial state")
        for t in range(steps):
            output = decoder.step(prepared, tokens, state)
            result = networks.step(arrays, tokens.numpy(), onnx_state)
            assert output.logits is not None
            _close(result.logits, output.logits, f"logits of step {t}")
            _close(result.log_probs, output.log_probs, f"log-probabilities of step {t}")
            _close(result.alpha, output.alpha, f"alpha of step {t}")
            assert (result.beta is None) == (output.beta is None)
            if output.beta is not None:
                _close(result.beta, output.beta, f"beta of step {t}")
            for index, (got, want) in enumerate(zip(result.state, flatten(output.state), strict=True)):
                _close(got, want, f"state tensor {index} after step {t}")
            tokens = torch.randint(4, V, (rows.numel(),), generator=generator)
            state = output.state.select(torch.from_numpy(swapped))
            onnx_state = tuple(array[swapped] for array in result.state)


class SharedDraws:
    """One stream of uniforms both searches draw from: ``random(n)`` for NumPy, ``multinomial`` for torch
    (inverse of the cumulative distribution: the first word whose cumulative mass passes the draw)."""

    def __init__(self, seed: int):
        self.uniforms = np.random.default_rng(seed).random(100_000)
        self.used = 0

    def random(self, n: int) -> np.ndarray:
        draws = self.uniforms[self.used : self.used + n]
        self.used += n
        return draws

    def multinomial(self, probs: torch.Tensor, count: int) -> torch.Tensor:
        assert count == 1
        cumulative = probs.cumsum(dim=1)
        draws = torch.from_numpy(self.random(probs.size(0))).to(probs.dtype) * cumulative[:, -1]
        chosen = (cumulative <= draws.unsqueeze(1)).sum(dim=1).clamp(max=probs.size(1) - 1)
        return chosen.unsqueeze(1)


def _flat(caption) -> list:
    return [caption, *caption.alternatives]


def assert_same_captions(
    decoder: CaptionDecoder, networks: OnnxNetworks, annotations: torch.Tensor, config: DecodeConfig
) -> list:
    """The NumPy search over ``networks`` gives the PyTorch search's captions under ``config``: the same
    words, ends, log-probabilities and scores within 1e-4, attention and gate values within 1e-4 (a
    sampling search draws from one stream of uniforms shared by both). Returns PyTorch's captions."""
    draws = SharedDraws(seed=7)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "multinomial", draws.multinomial)
        want = decoding.decode(decoder, annotations, config)
    draws.used = 0  # the same uniforms, in the same order
    arrays = annotations.numpy()
    if config.strategy == "greedy":
        got = numpy_greedy(networks, arrays, config)
    elif config.strategy == "beam":
        got = numpy_beam(networks, arrays, config)
    else:
        got = numpy_sample(networks, arrays, config, draws)  # type: ignore[arg-type]
    for expected, have in zip(want, got, strict=True):
        assert len(_flat(have)) == len(_flat(expected))
        for one, other in zip(_flat(expected), _flat(have), strict=True):
            assert other.tokens == one.tokens
            assert other.finished == one.finished
            assert other.log_prob == pytest.approx(one.log_prob, abs=1e-4)
            assert other.score == pytest.approx(one.score, abs=1e-4)
            np.testing.assert_allclose(other.attention, one.attention.numpy(), atol=1e-4)
            assert (other.betas is None) == (one.betas is None)
            if one.betas is not None:
                np.testing.assert_allclose(other.betas, one.betas.numpy(), atol=1e-4)
    return want


def check_export(decoder: CaptionDecoder, annotations: torch.Tensor, folder: Path) -> OnnxNetworks:
    """The whole check of one decoder: its graphs exported into ``folder`` step as it does, and the
    NumPy search over them gives its captions on every strategy (``CHECKED_SEARCHES``), which differ
    between images. Returns the graphs as the runtime reads them."""
    networks = exported_networks(decoder, annotations, folder)
    assert_graphs_step_as_torch(decoder, networks, annotations)
    for config in CHECKED_SEARCHES.values():
        captions = assert_same_captions(decoder, networks, annotations, config)
        if config.strategy == "greedy":
            assert len({tuple(c.tokens) for c in captions}) > 1, "the check needs captions that differ"
    return networks
