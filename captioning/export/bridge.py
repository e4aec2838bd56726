"""An ONNX export as a PyTorch ``Captioner``, for the tools that run in PyTorch's world: ``evaluate.py``
and ``visualize.py`` take an export folder as ``--checkpoint`` and caption through its graphs.

``OnnxEncoder`` (an ``Encoder``) and ``OnnxDecoder`` (a ``CaptionDecoder``) hand each call to the
export's ``OnnxNetworks`` (ONNX Runtime, NumPy arrays) and give tensors back, so that the project's
datasets, search, metrics and figures run unchanged over the graphs. A captioner without torch is
``captioning.load(folder, runtime="onnxruntime")`` (``captioning.export.model``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn
from torchvision.transforms import InterpolationMode

from captioning.config import Config
from captioning.export.runtime import OnnxNetworks, load_networks
from captioning.models.base import AttentionView, CaptionDecoder, StepOutput
from captioning.models.captioner import Captioner
from captioning.models.encoders.registry import Encoder, image_transform
from captioning.utils.errors import InputError


def _array(tensor: Tensor) -> np.ndarray:
    """A C-contiguous numpy view (a copy only when the tensor is not contiguous)."""
    return np.ascontiguousarray(tensor.detach().cpu().numpy())


def _tensors(arrays: tuple[np.ndarray, ...] | list[np.ndarray]) -> tuple[Tensor, ...]:
    return tuple(torch.from_numpy(np.asarray(array)) for array in arrays)


class OnnxEncoder(Encoder):
    """An ``Encoder`` whose network is the export's encoder graph: it reports the stored fingerprint's
    channels, grid and preprocessing; no parameters, nothing to fine-tune, its own inference copy."""

    def __init__(self, networks: OnnxNetworks, fingerprint: dict[str, Any]):
        nn.Module.__init__(self)  # no network of its own to build: the graph is the network
        self.networks = networks
        self.stored_fingerprint = fingerprint
        preprocessing = networks.preprocessing
        self.name = str(fingerprint["name"])
        self.image_size = preprocessing.image_size
        self.grid = self.native_grid = networks.grid
        self.grid_size = 0
        self.channels = networks.channels
        self.mean, self.std = preprocessing.mean, preprocessing.std
        self.interpolation = InterpolationMode(preprocessing.interpolation)
        self.weights = fingerprint["weights"]
        self.channels_last = False
        self.position_embedding_size = fingerprint.get("position_embedding_size")
        self._stages = ()
        self.trainable_stages = 0
        self.transform = image_transform(self.image_size, self.interpolation, self.mean, self.std)

    def forward(self, images: Tensor) -> Tensor:
        """(B, 3, S, S) normalised images -> (B, P, C) annotation vectors, through ONNX Runtime."""
        return torch.from_numpy(self.networks.encode(_array(images.float())))

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
    """A ``CaptionDecoder`` whose ``prepare``, ``init_state`` and ``step`` are the export's graphs; its
    attention view is the one they were traced with."""

    input_weight = ""
    layered = True  # the view is the export's: set_attention_view refuses any other

    def __init__(self, networks: OnnxNetworks, view: AttentionView, label: str):
        super().__init__()
        self.networks = networks
        self.vocab_size, self.annotation_dim = networks.vocab_size, networks.channels
        self.positions = networks.positions
        self.attention_view, self.label = view, label

    def set_attention_view(self, view: AttentionView) -> None:
        """Only the map the graphs were traced with: another one needs the PyTorch model."""
        if view != self.attention_view:
            raise InputError(
                "this ONNX export reports one attention map "
                f"({self.label or 'the only one'}): choose a layer or head with the PyTorch model"
            )

    def describe_attention(self) -> str:
        return self.label

    def prepare(self, annotations: Tensor) -> OnnxPrepared:
        return OnnxPrepared(_tensors(self.networks.prepare(_array(annotations))), self.positions)

    def init_state(self, annotations: Tensor) -> OnnxState:
        return OnnxState(_tensors(self.networks.init_state(_array(annotations))))

    def step(self, prepared: OnnxPrepared, tokens: Tensor, state: OnnxState) -> StepOutput:
        """Advance N = B * ``prepared.group`` rows by one word (see ``CaptionDecoder.step``)."""
        output = self.networks.step(
            tuple(_array(t) for t in prepared.tensors),
            _array(tokens.long()),
            tuple(_array(t) for t in state.tensors),
        )
        beta = None if output.beta is None else torch.from_numpy(output.beta)
        log_probs, alpha = torch.from_numpy(output.log_probs), torch.from_numpy(output.alpha)
        logits = torch.from_numpy(output.logits)
        return StepOutput(log_probs, OnnxState(_tensors(output.state)), alpha, beta, logits=logits)


def torch_captioner(folder: str | Path) -> tuple[Captioner, Config, str]:
    """The export in ``folder`` as a ``Captioner`` in eval mode on the CPU, the configuration it was
    trained with (``data.use_cache`` off: every grid comes from the encoder graph) and its stage.

    Raises:
        CheckpointError: as ``captioning.load(folder, runtime="onnxruntime")``.
    """
    from captioning.export.folder import read_json
    from captioning.hub.identity import CONFIG

    networks, config, vocab, description, stage = load_networks(folder, torch.get_num_threads())
    fingerprint = read_json(Path(folder) / CONFIG)["encoder_fingerprint"]
    encoder = OnnxEncoder(networks, fingerprint)
    decoder = OnnxDecoder(networks, description.view, description.label)
    config = replace(config, data=replace(config.data, use_cache=False))
    return Captioner(encoder, decoder, vocab, config.model).eval(), config, stage


__all__ = ["OnnxDecoder", "OnnxEncoder", "torch_captioner"]
