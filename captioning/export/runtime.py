"""Captioning with an ONNX export through ONNX Runtime, with the project's own search.

The graphs run in ONNX Runtime (CPU): the encoder, and the decoder's ``prepare``, ``init_state`` and
``step``. They are wrapped in the two parts a ``Captioner`` is made of, so that everything above runs
unchanged: ``OnnxEncoder`` (an ``Encoder``: the images' preprocessing comes from the export's encoder
fingerprint) and ``OnnxDecoder`` (a ``CaptionDecoder``: greedy, sampling and beam search in
``captioning.models.decoding`` call its ``prepare``, ``init_state``, ``step`` and the state's
``select``). PyTorch remains only as the glue: the images' resize and normalisation
(torchvision), and the search's bookkeeping over the arrays the graphs return (top-k, reordering
rows), each array passed between torch and numpy without a copy where it can be.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn
from torchvision.transforms import InterpolationMode

from captioning.config import Config
from captioning.export.folder import read_export, require
from captioning.export.graphs import ENCODER, INIT, PREPARE, STEP, StepLayout
from captioning.hub.checkpoint import CheckpointError
from captioning.hub.model_folder import CONFIG
from captioning.models.base import AttentionView, CaptionDecoder, StepOutput
from captioning.models.captioner import Captioner
from captioning.models.encoders.registry import Encoder, image_transform
from captioning.utils.errors import InputError


def _array(tensor: Tensor) -> np.ndarray:
    """A C-contiguous numpy view (a copy only when the tensor is not contiguous)."""
    return np.ascontiguousarray(tensor.detach().cpu().numpy())


class Graph:
    """One ONNX Runtime session on the CPU, its inputs and outputs checked against what they must be.

    Args:
        path: the .onnx file.
        inputs, outputs: the names the graph must take and give, in order.
        threads: intra-op threads (the process's torch setting, so both runtimes get the same).
    Raises:
        CheckpointError: ONNX Runtime cannot load the file, or its inputs or outputs differ.
    """

    def __init__(self, path: Path, inputs: list[str], outputs: list[str], threads: int):
        ort = require("onnxruntime")
        from onnxruntime.capi import onnxruntime_pybind11_state as state

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # errors only: not the notes on the nodes it places
        try:
            self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except (state.Fail, state.InvalidGraph, state.InvalidProtobuf, state.NoSuchFile) as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise CheckpointError(f"{path}: ONNX Runtime cannot load it ({first[:200]})") from None
        got_inputs = [i.name for i in self.session.get_inputs()]
        got_outputs = [o.name for o in self.session.get_outputs()]
        if got_inputs != inputs or got_outputs != outputs:
            raise CheckpointError(
                f"{path}: takes {', '.join(got_inputs)} and gives {', '.join(got_outputs)}, not what "
                f"{CONFIG} describes ({', '.join(inputs)} -> {', '.join(outputs)})"
            )
        self.path = path

    def run(self, feeds: dict[str, Tensor]) -> list[Tensor]:
        """The outputs, as CPU tensors sharing the arrays ONNX Runtime returned."""
        arrays = self.session.run(None, {name: _array(value) for name, value in feeds.items()})
        return [torch.from_numpy(np.asarray(array)) for array in arrays]


class OnnxEncoder(Encoder):
    """An ``Encoder`` whose network is the export's encoder graph, run by ONNX Runtime.

    It reports what an encoder reports (``channels``, ``grid``, ``transform``, ``fingerprint``) from
    the encoder fingerprint stored at export; it has no parameters and nothing to fine-tune, and is
    its own inference copy.

    Args:
        graph: the session of ``encoder.onnx``: (B, 3, S, S) -> (B, P, C).
        fingerprint: the trained encoder's ``Encoder.fingerprint()`` (checked by ``_fingerprint``).
    """

    def __init__(self, graph: Graph, fingerprint: dict[str, Any]):
        nn.Module.__init__(self)  # no network of its own to build: the graph is the network
        self.graph = graph
        self.stored_fingerprint = fingerprint
        self.name = str(fingerprint["name"])
        self.image_size = int(fingerprint["image_size"])
        self.grid = (int(fingerprint["grid"][0]), int(fingerprint["grid"][1]))
        self.native_grid = self.grid
        self.grid_size = 0
        self.channels = int(fingerprint["channels"])
        self.mean = tuple(float(v) for v in fingerprint["normalisation"]["mean"])
        self.std = tuple(float(v) for v in fingerprint["normalisation"]["std"])
        self.interpolation = InterpolationMode(fingerprint["interpolation"])
        self.weights = fingerprint["weights"]
        self.channels_last = False
        self.position_embedding_size = fingerprint.get("position_embedding_size")
        self._stages = ()
        self.trainable_stages = 0
        self.transform = image_transform(self.image_size, self.interpolation, self.mean, self.std)

    def forward(self, images: Tensor) -> Tensor:
        """(B, 3, S, S) normalised images -> (B, P, C) annotation vectors, through ONNX Runtime."""
        return self.graph.run({"images": images.float()})[0]

    def inference_copy(self) -> Encoder:
        return self  # nothing to fold: the graph was traced from the folded copy

    def train(self, mode: bool = True) -> OnnxEncoder:
        if mode:
            raise InputError("a model run by ONNX Runtime cannot be trained")
        nn.Module.train(self, False)
        return self

    def fingerprint(self) -> dict[str, Any]:
        return dict(self.stored_fingerprint)


class OnnxPrepared(NamedTuple):
    """The per-image tensors of ``decoder_prepare`` (each (B, ...)), read by ``group`` rows per image."""

    tensors: tuple[Tensor, ...]
    grid_positions: int  # P
    group: int = 1

    @property
    def positions(self) -> int:
        return self.grid_positions

    def select(self, index: Tensor) -> OnnxPrepared:
        return self._replace(tensors=tuple(t.index_select(0, index) for t in self.tensors))

    def head(self, n: int) -> OnnxPrepared:
        return self._replace(tensors=tuple(t[:n] for t in self.tensors))


class OnnxState(NamedTuple):
    """The decoder's state of N rows as the graphs hold it (each (N, ...)): reordered by ``select``."""

    tensors: tuple[Tensor, ...]

    def select(self, index: Tensor) -> OnnxState:
        return OnnxState(tuple(t.index_select(0, index) for t in self.tensors))


class OnnxDecoder(CaptionDecoder):
    """A ``CaptionDecoder`` whose ``prepare``, ``init_state`` and ``step`` are the export's graphs.

    Args:
        graphs: the sessions of ``decoder_prepare``, ``decoder_init`` and ``decoder_step``.
        layout: the decoder's tensors in them.
        vocab_size, annotation_dim, positions: V, C and P.
        view, label: the attention map ``alpha`` reports (fixed when the graphs were traced).
    """

    input_weight = ""
    layered = True  # the view is the export's: set_attention_view refuses any other

    def __init__(
        self,
        graphs: tuple[Graph, Graph, Graph],
        layout: StepLayout,
        vocab_size: int,
        annotation_dim: int,
        positions: int,
        view: AttentionView,
        label: str,
    ):
        super().__init__()
        self.prepare_graph, self.init_graph, self.step_graph = graphs
        self.layout = layout
        self.vocab_size, self.annotation_dim, self.positions = vocab_size, annotation_dim, positions
        self.attention_view = view
        self.label = label

    def set_attention_view(self, view: AttentionView) -> None:
        """Only the map the graphs were traced with: another one needs the PyTorch model.

        Raises:
            InputError: a view other than the exported one.
        """
        if view != self.attention_view:
            raise InputError(
                "this ONNX export reports one attention map "
                f"({self.label or 'the only one'}): choose a layer or head with the PyTorch model"
            )

    def describe_attention(self) -> str:
        return self.label

    def prepare(self, annotations: Tensor) -> OnnxPrepared:
        """Per-image work on (B, P, C), once per image."""
        return OnnxPrepared(tuple(self.prepare_graph.run({"annotations": annotations})), self.positions)

    def init_state(self, annotations: Tensor) -> OnnxState:
        """The state before the first word, one row per image of (B, P, C)."""
        return OnnxState(tuple(self.init_graph.run({"annotations": annotations})))

    def step(self, prepared: OnnxPrepared, tokens: Tensor, state: OnnxState) -> StepOutput:
        """Advance N = B * ``prepared.group`` rows by one word (see ``CaptionDecoder.step``)."""
        feeds = {"tokens": tokens.long()}
        feeds.update(zip(self.layout.prepared_names(), prepared.tensors, strict=True))
        feeds.update(zip(self.layout.state_names(), state.tensors, strict=True))
        outputs = self.step_graph.run(feeds)
        log_probs, alpha = outputs[0], outputs[1]
        beta = outputs[2] if self.layout.beta else None
        return StepOutput(log_probs, OnnxState(tuple(outputs[2 + self.layout.beta :])), alpha, beta)


def _is_int(value: Any, low: int = 1, high: int = 1 << 20) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _numbers(values: Any, positive: bool = False) -> bool:
    return (
        isinstance(values, list)
        and len(values) == 3
        and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and (v > 0 or not positive)
            for v in values
        )
    )


def _fingerprint(description: dict[str, Any], path: Path) -> dict[str, Any]:
    """The stored encoder fingerprint, checked for what the preprocessing and the sizes need."""
    fingerprint = description.get("encoder_fingerprint")
    valid = isinstance(fingerprint, dict)
    if isinstance(fingerprint, dict):
        grid = fingerprint.get("grid")
        normalisation = fingerprint.get("normalisation")
        valid = (
            isinstance(fingerprint.get("name"), str)
            and _is_int(fingerprint.get("image_size"), 1, 8192)
            and _is_int(fingerprint.get("channels"))
            and isinstance(grid, list)
            and len(grid) == 2
            and all(_is_int(g, 1, 8192) for g in grid)
            and fingerprint.get("interpolation") in {mode.value for mode in InterpolationMode}
            and isinstance(normalisation, dict)
            and _numbers(normalisation.get("mean"))
            and _numbers(normalisation.get("std"), positive=True)
        )
    if not valid or not isinstance(fingerprint, dict):
        raise CheckpointError(
            f'{path}: entry "encoder_fingerprint" must describe the encoder (name, image_size, grid, '
            f"channels, interpolation, normalisation), got {json.dumps(fingerprint)[:80]}"
        )
    return fingerprint


def load_onnx(folder: str | Path) -> tuple[Captioner, Config, str]:
    """The captioner of an ONNX export, run by ONNX Runtime on the CPU.

    Returns:
        The ``Captioner`` (``OnnxEncoder`` and ``OnnxDecoder``), the configuration it was trained
        with and its training stage (``xe``, or ``scst`` after self-critical epochs).
    Raises:
        CheckpointError: not an export, a missing, changed or unreadable file, a tampered
            config.json (one line naming the file and the entry).
        InputError: onnxruntime is not installed.
    """
    require("onnxruntime")
    folder = Path(folder)
    config, vocab, description, export = read_export(folder)
    fingerprint = _fingerprint(description, folder / CONFIG)
    threads = torch.get_num_threads()
    layout = export.layout
    encoder = OnnxEncoder(Graph(folder / ENCODER, ["images"], ["annotations"], threads), fingerprint)
    graphs = (
        Graph(folder / PREPARE, ["annotations"], layout.prepared_names(), threads),
        Graph(folder / INIT, ["annotations"], layout.state_names(), threads),
        Graph(
            folder / STEP,
            ["tokens", *layout.prepared_names(), *layout.state_names()],
            layout.step_outputs(),
            threads,
        ),
    )
    positions = encoder.grid[0] * encoder.grid[1]
    decoder = OnnxDecoder(graphs, layout, len(vocab), encoder.channels, positions, export.view, export.label)
    _check_sizes(folder, encoder, decoder, len(vocab))
    stage = "scst" if description.get("stage") == "scst" else "xe"
    captioner = Captioner(encoder, decoder, vocab, config.model)
    return captioner.eval(), config, stage


def _check_sizes(folder: Path, encoder: OnnxEncoder, decoder: OnnxDecoder, words: int) -> None:
    """One blank image through every graph, its sizes against config.json's: the annotations (P, C),
    the step's log_probs (V) and alpha (P)."""
    from captioning.data.vocab import Vocabulary

    with torch.inference_mode():
        images = torch.zeros(1, 3, encoder.image_size, encoder.image_size)
        annotations = encoder(images)
        expected = (1, decoder.positions, encoder.channels)
        if tuple(annotations.shape) != expected:
            raise CheckpointError(
                f"{folder / ENCODER}: gives annotations of {tuple(annotations.shape)[1:]} (positions, "
                f'channels), but {folder / CONFIG} entry "encoder_fingerprint" says {expected[1:]}'
            )
        tokens = torch.full((1,), Vocabulary.start_id, dtype=torch.long)
        output = decoder.step(decoder.prepare(annotations), tokens, decoder.init_state(annotations))
    if tuple(output.log_probs.shape) != (1, words) or tuple(output.alpha.shape) != (1, decoder.positions):
        raise CheckpointError(
            f"{folder / STEP}: scores {output.log_probs.shape[-1]} words over {output.alpha.shape[-1]} "
            f"positions, but the export's vocabulary has {words} words and its grid {decoder.positions}"
        )
