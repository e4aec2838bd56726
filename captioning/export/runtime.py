"""An ONNX export's graphs run by ONNX Runtime on the CPU, over NumPy arrays: no torch.

``load_networks(folder)`` reads the folder (``captioning.export.folder``), opens the four graphs and
checks them on one blank image; it returns ``OnnxNetworks``: the images' preprocessing (PIL and
NumPy, from the export's encoder fingerprint: ``Preprocessing``), the encoder, and the decoder's
``prepare``, ``init_state`` and ``step``, which the search (``captioning.export.search``) drives as
``captioning.models.decoding`` drives a PyTorch decoder.

Every failure of ONNX Runtime, when a graph is opened or run (a malformed graph, one that asks for
more memory than there is), is one line naming the graph's file (``CheckpointError``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from captioning.config import Config
from captioning.data.vocab import Vocabulary
from captioning.export.folder import ExportDescription, read_export, require
from captioning.export.layout import ENCODER, INIT, PREPARE, STEP, StepLayout
from captioning.hub.identity import CONFIG
from captioning.utils.errors import CheckpointError

# torchvision's InterpolationMode values -> the PIL filter its Resize applies to a PIL image
RESAMPLING = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
    "lanczos": Image.Resampling.LANCZOS,
}


def _runtime_errors() -> tuple[type[BaseException], ...]:
    """Every exception class ONNX Runtime raises (each derives from ``Exception`` alone)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    kinds = [getattr(state, name) for name in dir(state)]
    return tuple(k for k in kinds if isinstance(k, type) and issubclass(k, Exception)) + (MemoryError,)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:200]


def default_threads() -> int:
    """Intra-op threads: ``OMP_NUM_THREADS`` when set (as torch reads it), else ONNX Runtime's default."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else 0


class Graph:
    """One ONNX Runtime session on the CPU, its inputs and outputs checked against what they must be.

    Args:
        path: the .onnx file.
        inputs, outputs: the names the graph must take and give, in order.
        threads: intra-op threads (0: ONNX Runtime's default).
    Raises:
        CheckpointError: ONNX Runtime cannot load the file, or its inputs or outputs differ.
    """

    def __init__(self, path: Path, inputs: list[str], outputs: list[str], threads: int = 0):
        ort = require("onnxruntime", "onnx-runtime")
        self.errors = _runtime_errors()
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # errors only: not the notes on the nodes it places
        try:
            self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except self.errors as error:
            raise CheckpointError(f"{path}: ONNX Runtime cannot load it ({_first_line(error)})") from None
        got_inputs = [i.name for i in self.session.get_inputs()]
        got_outputs = [o.name for o in self.session.get_outputs()]
        if got_inputs != inputs or got_outputs != outputs:
            raise CheckpointError(
                f"{path}: takes {', '.join(got_inputs)} and gives {', '.join(got_outputs)}, not what "
                f"{CONFIG} describes ({', '.join(inputs)} -> {', '.join(outputs)})"
            )
        self.path = path

    def input_shape(self, index: int = 0) -> list[Any]:
        """The shape the graph declares for an input (a name for a dynamic axis)."""
        return list(self.session.get_inputs()[index].shape)

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The outputs, as NumPy arrays.

        Raises:
            CheckpointError: ONNX Runtime fails to run it (one line naming the file).
        """
        try:
            return list(self.session.run(None, feeds))
        except self.errors as error:
            raise CheckpointError(
                f"{self.path}: ONNX Runtime failed running it ({_first_line(error)})"
            ) from None


@dataclass(frozen=True)
class Preprocessing:
    """PIL RGB image -> normalised (3, S, S) float32 array, as the PyTorch model's transform: resized to
    a square without cropping with the fingerprint's filter, scaled to [0, 1], normalised per channel
    (``torchvision``'s ``Resize`` on a PIL image is PIL's resize; ``ToTensor`` divides by 255)."""

    image_size: int
    interpolation: str
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    def __call__(self, picture: Image.Image) -> np.ndarray:
        size = (self.image_size, self.image_size)
        pixels = np.asarray(picture.convert("RGB").resize(size, RESAMPLING[self.interpolation]))
        scaled = pixels.astype(np.float32) / np.float32(255.0)  # (S, S, 3)
        mean = np.asarray(self.mean, dtype=np.float32)
        std = np.asarray(self.std, dtype=np.float32)
        return np.ascontiguousarray(((scaled - mean) / std).transpose(2, 0, 1))  # (3, S, S)


@dataclass(frozen=True)
class StepResult:
    """One decoding step of N rows: ``log_probs`` (N, V), ``alpha`` (N, P), ``beta`` (N,) or None, the
    next state's arrays (each (N, ...)), and the ``logits`` (N, V) ``log_probs`` is the log-softmax of
    (greedy decoding and sampling choose from them, the repetition penalty applied to them)."""

    log_probs: np.ndarray
    alpha: np.ndarray
    beta: np.ndarray | None
    state: tuple[np.ndarray, ...]
    logits: np.ndarray


class OnnxNetworks:
    """The export's four graphs, and what they need to be fed: the preprocessing and the sizes.

    Attributes:
        preprocessing: picture -> (3, S, S) array.
        grid: (gh, gw); ``positions`` P = gh * gw; ``channels`` C; ``vocab_size`` V.
    """

    def __init__(
        self,
        graphs: tuple[Graph, Graph, Graph, Graph],
        layout: StepLayout,
        preprocessing: Preprocessing,
        grid: tuple[int, int],
        channels: int,
        vocab_size: int,
    ):
        self.encoder, self.prepare_graph, self.init_graph, self.step_graph = graphs
        self.layout, self.preprocessing = layout, preprocessing
        self.grid, self.channels, self.vocab_size = grid, channels, vocab_size
        self.positions = grid[0] * grid[1]

    def encode(self, images: np.ndarray) -> np.ndarray:
        """(B, 3, S, S) normalised images -> (B, P, C) annotation vectors."""
        return self.encoder.run({"images": images.astype(np.float32, copy=False)})[0]

    def prepare(self, annotations: np.ndarray) -> tuple[np.ndarray, ...]:
        """Per-image work on (B, P, C), once per image: each array (B, ...)."""
        return tuple(self.prepare_graph.run({"annotations": annotations}))

    def init_state(self, annotations: np.ndarray) -> tuple[np.ndarray, ...]:
        """The state before the first word, one row per image of (B, P, C)."""
        return tuple(self.init_graph.run({"annotations": annotations}))

    def step(
        self, prepared: tuple[np.ndarray, ...], tokens: np.ndarray, state: tuple[np.ndarray, ...]
    ) -> StepResult:
        """Advance N = B * G rows (G per image, image-major; G read from the shapes) by one word."""
        feeds = {"tokens": tokens.astype(np.int64, copy=False)}
        feeds.update(zip(self.layout.prepared_names(), prepared, strict=True))
        feeds.update(zip(self.layout.state_names(), state, strict=True))
        outputs = self.step_graph.run(feeds)
        # The graph gives the logits (an export from before 2026-12-07: the log-probabilities, whose
        # log-softmax is themselves); the log-probabilities are their log-softmax, as in PyTorch.
        logits = outputs[0].astype(np.float32, copy=False)
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        beta = outputs[2] if self.layout.beta else None
        return StepResult(log_probs, outputs[1], beta, tuple(outputs[2 + self.layout.beta :]), logits)


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
            and fingerprint.get("interpolation") in RESAMPLING
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


def load_networks(
    folder: str | Path, threads: int | None = None
) -> tuple[OnnxNetworks, Config, Vocabulary, ExportDescription, str]:
    """The graphs of an ONNX export, opened and checked on one blank image.

    Returns:
        The networks, the configuration the model was trained with, its vocabulary, what config.json
        says of the graphs, and its training stage (``xe``, or ``scst`` after self-critical epochs).
    Raises:
        CheckpointError: not an export, a missing, changed or unreadable file, a tampered config.json,
            a graph that does not fit config.json or fails its check (one line naming the file).
        InputError: onnxruntime is not installed.
    """
    require("onnxruntime", "onnx-runtime")
    folder = Path(folder)
    config, vocab, description, export = read_export(folder)
    fingerprint = _fingerprint(description, folder / CONFIG)
    threads = default_threads() if threads is None else threads
    layout = export.layout
    encoder = Graph(folder / ENCODER, ["images"], ["annotations"], threads)
    size = int(fingerprint["image_size"])
    if encoder.input_shape()[1:] != [3, size, size]:
        raise CheckpointError(
            f"{folder / ENCODER}: takes images of {tuple(encoder.input_shape()[1:])} (channels, height, "
            f'width), but {folder / CONFIG} entry "encoder_fingerprint.image_size" says {size}'
        )
    graphs = (
        encoder,
        Graph(folder / PREPARE, ["annotations"], layout.prepared_names(), threads),
        Graph(folder / INIT, ["annotations"], layout.state_names(), threads),
        Graph(
            folder / STEP,
            ["tokens", *layout.prepared_names(), *layout.state_names()],
            layout.step_outputs(),
            threads,
        ),
    )
    normalisation = fingerprint["normalisation"]
    preprocessing = Preprocessing(
        size,
        fingerprint["interpolation"],
        tuple(float(v) for v in normalisation["mean"]),  # type: ignore[arg-type]
        tuple(float(v) for v in normalisation["std"]),  # type: ignore[arg-type]
    )
    grid = (int(fingerprint["grid"][0]), int(fingerprint["grid"][1]))
    networks = OnnxNetworks(graphs, layout, preprocessing, grid, int(fingerprint["channels"]), len(vocab))
    _check_sizes(folder, networks)
    stage = "scst" if description.get("stage") == "scst" else "xe"
    return networks, config, vocab, export, stage


def _check_sizes(folder: Path, networks: OnnxNetworks) -> None:
    """One blank image through every graph, its sizes against config.json's: the annotations (P, C),
    the step's log_probs (V) and alpha (P)."""
    size = networks.preprocessing.image_size
    annotations = networks.encode(np.zeros((1, 3, size, size), dtype=np.float32))
    expected = (1, networks.positions, networks.channels)
    if tuple(annotations.shape) != expected:
        raise CheckpointError(
            f"{folder / ENCODER}: gives annotations of {tuple(annotations.shape)[1:]} (positions, "
            f'channels), but {folder / CONFIG} entry "encoder_fingerprint" says {expected[1:]}'
        )
    tokens = np.full((1,), Vocabulary.start_id, dtype=np.int64)
    output = networks.step(networks.prepare(annotations), tokens, networks.init_state(annotations))
    words, positions = networks.vocab_size, networks.positions
    if output.log_probs.shape != (1, words) or output.alpha.shape != (1, positions):
        raise CheckpointError(
            f"{folder / STEP}: scores {output.log_probs.shape[-1]} words over {output.alpha.shape[-1]} "
            f"positions, but the export's vocabulary has {words} words and its grid {positions}"
        )


__all__ = ["Graph", "OnnxNetworks", "Preprocessing", "StepResult", "load_networks"]
