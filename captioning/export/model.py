"""An ONNX export ready to caption images without torch: what ``captioning.load(folder,
runtime="onnxruntime")`` returns.

It takes what ``CaptioningModel.caption`` takes (paths, PIL images, arrays; any ``DecodeConfig``
option by name; ``layer``/``head`` only for the map the graphs were traced with) and returns the same
``Caption`` objects, the images resized and normalised with PIL and NumPy
(``captioning.export.runtime.Preprocessing``) and the search run over NumPy arrays
(``captioning.export.search``). ``seed`` makes sampling repeatable.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from captioning.config import Config, ConfigError, DecodeConfig
from captioning.config.loading import decode_config_with
from captioning.data.images import as_rgb_image, check_picture
from captioning.data.tokenizers import detokenize
from captioning.data.vocab import Vocabulary
from captioning.export.beam import beam_search
from captioning.export.folder import ExportDescription
from captioning.export.runtime import OnnxNetworks, load_networks
from captioning.export.search import Hypothesis, greedy_search, sample_captions
from captioning.models.caption import Caption
from captioning.models.views import attention_view
from captioning.utils.errors import InputError
from captioning.utils.memory import available_bytes, gib


@dataclass
class OnnxCaptioningModel:
    """An ONNX export's networks with its vocabulary and configuration (``load`` builds one).

    Attributes:
        networks: the graphs and their preprocessing.
        config: the configuration the model was trained with (``decode``: the default decoding).
        vocab: the words the model can say.
        description: what config.json says of the graphs (the attention map they report).
        source: the folder it was loaded from.
        stage: ``xe``, or ``scst`` after self-critical epochs.
    """

    networks: OnnxNetworks
    config: Config
    vocab: Vocabulary
    description: ExportDescription
    source: Path
    stage: str = "xe"
    runtime: str = "onnxruntime"

    @classmethod
    def load(cls, folder: str | Path, threads: int | None = None) -> OnnxCaptioningModel:
        """Open and check the export in ``folder`` (see ``captioning.export.runtime.load_networks``)."""
        networks, config, vocab, export, stage = load_networks(folder, threads)
        return cls(networks, config, vocab, export, Path(folder), stage)

    def __repr__(self) -> str:
        model = self.config.model
        stage = "after self-critical training" if self.stage == "scst" else "after cross-entropy training"
        return (
            f"OnnxCaptioningModel({str(self.source)!r}, {stage}: {model.encoder.name} encoder, "
            f"{model.decoder.kind} decoder, {len(self.vocab)} words, grid {self.grid[0]}x{self.grid[1]}, "
            "run by onnxruntime on the CPU)"
        )

    @property
    def grid(self) -> tuple[int, int]:
        """(gh, gw), the attention grid of every ``Caption.attention``."""
        return self.networks.grid

    @property
    def decode_config(self) -> DecodeConfig:
        """The decoding options ``caption`` uses when none is given (the export's)."""
        return self.config.decode

    def caption(
        self,
        images: Iterable[Any],
        decode_options: DecodeConfig | None = None,
        *,
        layer: str | int | None = None,
        head: str | int | None = None,
        seed: int | None = None,
        **overrides: object,
    ) -> list[Caption]:
        """Caption images batch by batch, as ``CaptioningModel.caption`` (its arguments and checks);
        one ``Caption`` per image, in order.

        Args:
            seed: the NumPy generator's seed for ``strategy="sample"`` (None: fresh randomness).
        Raises:
            ImageError, ConfigError: as ``CaptioningModel.caption``, before any work.
            InputError: a layer or head other than the one the graphs report.
        """
        single = (str, Path, Image.Image, np.ndarray)
        torch = sys.modules.get("torch")
        if isinstance(images, single + ((torch.Tensor,) if torch is not None else ())):
            raise TypeError(
                f"caption() takes a list of images, got one {type(images).__name__}: "
                "pass [image] for a single image"
            )
        decode_config = decode_config_with(decode_options or self.config.decode, **overrides)
        if attention_view(layer, head) != self.description.view:
            raise InputError(
                "this ONNX export reports one attention map "
                f"({self.description.label or 'the only one'}): choose a layer or head with the PyTorch model"
            )
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise InputError(f"seed must be a whole number >= 0, got {seed!r}")
        images = list(images)
        for k, image in enumerate(images):  # every input and file header, before any pixel is decoded
            check_picture(image, f"images[{k}]")
        if not images:
            return []
        self._check_fits(decode_config, len(images))
        rng = np.random.default_rng(seed)
        captions: list[Caption] = []
        size = decode_config.batch_size
        for start in range(0, len(images), size):  # one batch of decoded pictures in memory at a time
            pixels = np.stack(
                [
                    self.networks.preprocessing(as_rgb_image(image, f"images[{k}]"))
                    for k, image in enumerate(images[start : start + size], start)
                ]
            )  # (B, 3, S, S)
            found = _search(self.networks, self.networks.encode(pixels), decode_config, rng)
            captions += [self._public(hypothesis, decode_config.num_return) for hypothesis in found]
        return captions

    def _public(self, hypothesis: Hypothesis, asked: int = 1) -> Caption:
        """The public form of a hypothesis of a search for ``asked`` captions (``Caption.missing``)."""
        words = [self.vocab.itos[t] for t in hypothesis.tokens]
        return Caption(
            detokenize(words, self.config.data.tokenizer),
            words,
            hypothesis.attention.reshape(len(words), *self.grid),
            hypothesis.betas,
            hypothesis.log_prob,
            hypothesis.score,
            hypothesis.finished,
            self.description.label,
            tuple(self._public(other) for other in hypothesis.alternatives),
            max(asked - 1 - len(hypothesis.alternatives), 0),
        )

    def _check_fits(self, config: DecodeConfig, images: int) -> None:
        """Refuse, before any work, a search whose hypotheses do not fit in free memory: each keeps a few
        (V,) score rows, a (P,) map per word and its own copy of the (P, C) grid (as
        ``captioning.models.memory_bounds.hypothesis_bytes``); each image its (P, C) grid."""
        rows = {"beam": config.beam_size, "sample": config.num_return}.get(config.strategy, 1)
        key = {"beam": "decode.beam_size", "sample": "decode.num_return"}.get(
            config.strategy, "decode.batch_size"
        )
        batch = min(config.batch_size, images)
        networks = self.networks
        per_row = 3 * networks.vocab_size + (config.max_length + 1) * (networks.positions + 2)
        per_row += networks.positions * networks.channels  # the grid each hypothesis's attention reads
        needed = 4 * batch * (rows * per_row + networks.positions * networks.channels)
        free = available_bytes("cpu")
        if free is not None and needed > free:
            raise ConfigError(
                f"{key} {rows} x decode.batch_size {config.batch_size} hypotheses of up to "
                f"decode.max_length {config.max_length} words need about {gib(needed)}, more than the "
                f"{gib(free)} free; lower {key}, decode.max_length or decode.batch_size"
            )

    def explain(self, *args: object, **kwargs: object) -> None:
        """Attribution needs gradients: refused (the PyTorch model explains)."""
        raise InputError(self._needs_torch("explain()"))

    def save_pretrained(self, *args: object, **kwargs: object) -> None:
        """Refused: an export holds graphs, not the PyTorch weights a model folder needs."""
        raise InputError(self._needs_torch("save_pretrained()"))

    def export(self, *args: object, **kwargs: object) -> None:
        """Refused: export the PyTorch model the graphs came from."""
        raise InputError(self._needs_torch("export()"))

    def _needs_torch(self, what: str) -> str:
        return (
            f"{what} needs the PyTorch weights; this model ({self.source}) runs ONNX graphs: "
            "load the checkpoint or model folder it was exported from"
        )


def _search(
    networks: OnnxNetworks, annotations: np.ndarray, config: DecodeConfig, rng: np.random.Generator
) -> list[Hypothesis]:
    """Caption B images (B, P, C) with the strategy and options of ``config``."""
    if config.strategy == "greedy":
        return greedy_search(networks, annotations, config)
    if config.strategy == "sample":
        return sample_captions(networks, annotations, config, rng)
    return beam_search(networks, annotations, config)


__all__ = ["OnnxCaptioningModel"]
