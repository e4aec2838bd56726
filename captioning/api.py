"""The Python API: load a trained model, caption images, draw where it looked.

::

    import captioning

    model = captioning.load("runs/shapes/checkpoints/best.pt")  # or a save_pretrained folder
    caption = model.caption(["photo.jpg"], beam_size=3)[0]
    print(caption.text)
    captioning.show(caption, "photo.jpg").savefig("photo_attention.png")

Everything goes through the code ``evaluate.py --images`` and ``visualize.py`` run: the model is
rebuilt by ``load_captioner``, images are captioned in batches by ``caption_records`` (decoded one
batch at a time) and figures are drawn by ``attention_figure``, so the captions and the pictures are theirs.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, overload

import numpy as np
from PIL import Image

from captioning.config import Config, DecodeConfig
from captioning.config.loading import decode_config_with
from captioning.data.images import ImageError, as_rgb_image, check_picture
from captioning.data.records import ImageRecord
from captioning.data.vocab import Vocabulary
from captioning.models.caption import Caption
from captioning.models.views import attention_view
from captioning.utils.errors import InputError
from captioning.utils.imports import import_modules

# torch and matplotlib load with the first PyTorch model or figure: an ONNX export captions without them
if TYPE_CHECKING:
    import torch
    from matplotlib.figure import Figure

    from captioning.explain.captions import WordExplanation
    from captioning.explain.config import ExplainConfig
    from captioning.export.model import OnnxCaptioningModel
    from captioning.inference.captioner import Captioned
    from captioning.models.captioner import Captioner

ImageInput: TypeAlias = "str | Path | Image.Image | np.ndarray | torch.Tensor"
"""A path, a PIL image, a (C, H, W) tensor or an (H, W, C) array (see ``as_rgb_image``)."""


def single_image(images: object) -> bool:
    """Whether ``images`` is one image where a list of them is expected."""
    torch = sys.modules.get("torch")  # a tensor exists only once torch is imported
    kinds: tuple[type, ...] = (str, Path, Image.Image, np.ndarray)
    return isinstance(images, kinds + ((torch.Tensor,) if torch is not None else ()))


def public_caption(
    item: Captioned, grid: tuple[int, int], attention_label: str = "", asked: int = 1
) -> Caption:
    """The public form of one decoded image (``caption_records``' output), decoded with
    ``decode.num_return`` ``asked`` (``Caption.missing``: how many fewer came)."""
    decoded = item.caption
    # (T, gh, gw): one attention map per word
    attention = decoded.attention.detach().float().cpu().numpy().reshape(len(item.words), *grid)
    beta = None if decoded.betas is None else decoded.betas.detach().float().cpu().numpy()  # (T,)
    return Caption(
        item.text,
        list(item.words),
        attention,
        beta,
        float(decoded.log_prob),
        float(decoded.score),
        bool(decoded.finished),
        attention_label,
        tuple(public_caption(other, grid, attention_label) for other in item.alternatives),
        max(asked - len(item.ranked), 0),
    )


@dataclass(frozen=True, eq=False)
class Explanation:
    """One image's caption and, per method, where each word's evidence lies (``model.explain``).

    Attributes:
        caption: the :class:`Caption`.
        maps: method -> (T, gh, gw) float32 map of each word (``attention`` sums to 1; the others are
            signed scores on their own scale).
        curves: the per-word curves, numpy arrays: ``deletion``, ``insertion`` (method -> (T, K) the
            word's probability at each point), ``deletion_auc``, ``insertion_auc`` (method -> (T,)
            areas, trapezoid over ``shares``) and ``shares`` ((K,) the share of cells changed at each
            point); empty dicts without curves.
    """

    caption: Caption
    maps: dict[str, np.ndarray]
    curves: WordExplanation


class CaptioningModel:
    """A trained captioner ready to caption images (what ``load`` returns).

    Args:
        captioner: the encoder and decoder, in eval mode, on ``device``.
        config: the configuration it was trained with (its ``decode`` section is the default decoding).
        device: where images are encoded and decoded.
        source: the checkpoint file or model folder it was loaded from.
    """

    def __init__(
        self,
        captioner: Captioner,
        config: Config,
        device: torch.device,
        source: Path,
        stage: str = "xe",
        runtime: str = "torch",
    ) -> None:
        self.captioner = captioner
        self.config = config
        self.device = device
        self.source = Path(source)
        self.stage = stage  # the training its weights had: xe (cross-entropy) or scst (then self-critical)
        self.runtime = runtime  # what runs the networks: torch, or onnxruntime (an ONNX export)

    def __repr__(self) -> str:
        model = self.config.model
        stage = "after self-critical training" if self.stage == "scst" else "after cross-entropy training"
        return (
            f"CaptioningModel({str(self.source)!r}, {stage}: {model.encoder.name} encoder, "
            f"{model.decoder.kind} decoder, "
            f"{len(self.vocab)} words, grid {self.grid[0]}x{self.grid[1]}, "
            + (f"on {self.device})" if self.runtime == "torch" else f"run by {self.runtime} on the CPU)")
        )

    @property
    def vocab(self) -> Vocabulary:
        """The words the model can say."""
        return self.captioner.vocab

    @property
    def grid(self) -> tuple[int, int]:
        """(gh, gw), the attention grid of every ``Caption.attention``."""
        return self.captioner.grid

    @property
    def decode_config(self) -> DecodeConfig:
        """The decoding options ``caption`` uses when none is given (the checkpoint's)."""
        return self.config.decode

    def caption(
        self,
        images: Iterable[ImageInput],
        decode: DecodeConfig | None = None,
        *,
        layer: str | int | None = None,
        head: str | int | None = None,
        **overrides: object,
    ) -> list[Caption]:
        """Caption images, decoded batch by batch; one ``Caption`` per image, in order.

        Every input is checked before any is decoded: its type, shape and values, and for a path the
        file and its header (its size and mode, ``check_image_cost``). Then the pixels are decoded one
        batch of ``decode.batch_size`` at a time and captioned before the next batch is decoded, so the
        memory held is one batch of decoded pictures (plus the model), whatever the number of images.

        Args:
            images: a list or any iterable (read once, before any work) of paths, PIL images,
                (C, H, W) tensors or (H, W, C) arrays (uint8, or floats in [0, 1]), of any size.
            decode: the decoding options (``DecodeConfig``, or a subclass of it with options of
                its own); by default the checkpoint's (``decode_config``).
            overrides: any field of ``DecodeConfig`` by name (``strategy="beam"``, ``beam_size=5``,
                ``top_p=0.9``, ``num_return=3``, ...), changing ``decode`` for this call, as
                ``evaluate.py``'s flags and ``--set decode.*`` do; an unknown name is refused.
            layer, head: the attention map reported (Transformer): a decoder layer and head, 1-based,
                or ``"mean"``; by default the mean of the heads of the last layer (as ``visualize.py``).
        Returns:
            ``Caption`` objects; captions equal ``evaluate.py --images`` on the same files and options.
            With ``num_return`` n > 1 each holds its image's next n - 1 distinct captions, ranked,
            in ``alternatives`` (``ranked`` lists all n), or fewer when the search found fewer distinct
            ones: ``missing`` says how many fewer.
        Raises:
            ImageError: an image cannot be read or has a wrong shape, type or range (naming ``images[k]``);
                before any work, except a file found damaged only when its batch is decoded (truncated
                after its header).
            ConfigError: an invalid or unknown decoding option.
            ValueError: a layer or head the decoder does not have.
        """
        from captioning.models.decoding import check_decoding_fits
        from captioning.models.encoders.activations import check_encoder_fits
        from captioning.visualization.views import check_layer_choice

        if single_image(images):
            raise TypeError(
                f"caption() takes a list of images, got one {type(images).__name__}: "
                "pass [image] for a single image"
            )
        decode = decode_config_with(decode or self.config.decode, **overrides)
        view = attention_view(layer, head)
        images = list(images)  # consumed once: an iterator is read here, before any work
        for k, image in enumerate(images):  # every input and file header, before any pixel is decoded
            check_picture(image, f"images[{k}]")
        if not images:
            return []
        positions = self.grid[0] * self.grid[1]
        check_decoding_fits(
            decode,
            len(self.vocab),
            positions,
            len(images),
            self.device,
            self.captioner.decoder.annotation_dim,
        )
        images_per_pass = min(decode.batch_size, len(images))
        check_encoder_fits(self.captioner.encoder, images_per_pass, self.device, "decode.batch_size")
        decoder = self.captioner.decoder
        check_layer_choice(decoder, self.config.model.decoder.kind, "layer", layer)
        decoder.set_attention_view(view)  # the captions' maps are this view's
        label = decoder.describe_attention()
        # In this process: no DataLoader workers for pictures already in memory.
        config = replace(self.config, data=replace(self.config.data, num_workers=0))
        captions: list[Caption] = []
        size = decode.batch_size
        for start in range(0, len(images), size):  # one batch of decoded pictures in memory at a time
            captions += self._caption_batch(images[start : start + size], start, config, decode, label)
        return captions

    def _caption_batch(
        self, batch: list[ImageInput], start: int, config: Config, decode: DecodeConfig, label: str
    ) -> list[Caption]:
        """Decode and caption ``batch``, the images from ``images[start]`` on (one decoding batch);
        its pictures are freed on return."""
        numbered = list(enumerate(batch, start))
        pictures = [as_rgb_image(image, f"images[{k}]") for k, image in numbered]
        records = [
            ImageRecord(
                image_id=k,
                path=Path(image) if isinstance(image, (str, Path)) else Path(f"images[{k}]"),
                split="",
            )
            for k, image in numbered
        ]
        from captioning.inference.captioner import caption_records

        captioned = caption_records(
            self.captioner, config, records, self.device, decode, progress=False, pictures=pictures
        )
        return [public_caption(item, self.grid, label, decode.num_return) for item in captioned]

    def explain(
        self,
        images: Iterable[ImageInput],
        methods: Sequence[str] | str = ("attention", "gradient", "gradcam"),
        *,
        curves: bool = True,
        baseline: str | np.ndarray | torch.Tensor = "dataset_mean",
        settings: ExplainConfig | None = None,
        **options: Any,
    ) -> list[Explanation]:
        """Caption images and explain each word with attribution methods (``captioning.explain``).

        Every option is checked before any work (no image is decoded, no grid encoded): its type,
        range and cost (``captioning.explain.config``, ``captioning.explain.cost``), the baseline's
        shape and values, the decoding options and the images as :meth:`caption` checks them.

        Args:
            images: as for :meth:`caption` (a non-empty list).
            methods: names in ``captioning.explain.METHODS`` (a list or ``"attention,gradcam"``).
            curves: also each word's deletion and insertion curves (the word's probability as the
                cells are removed, or inserted, in the order its map ranks them).
            baseline: what a removed cell holds: ``dataset_mean`` (the training split's mean grid
                feature, computed once and kept in the run folder), ``zeros``, ``blur`` (each image
                blurred on its pixels), or a (C,) tensor or numpy array of finite values.
            settings: an ``ExplainConfig`` (or a subclass of it with fields of its own) to start from.
            options: any field of ``ExplainConfig`` by name (``ig_steps=16``, ``curve_steps=10``,
                ``score="logit"``, ``order_seed=0``, ...), and :meth:`caption`'s keyword arguments
                (``beam_size=3``, ``layer=``, ``head=``, ...); an unknown name is refused.
        Returns:
            one :class:`Explanation` per image, in order; numpy arrays throughout.
        Raises:
            InputError: a bad option (naming it), a method that cannot explain this model (rollout of
                an LSTM), a model run by ONNX Runtime (no gradients), no image.
            UnknownNameError: an unregistered method.
            ImageError, ConfigError: as ``caption``.
        """
        from captioning.explain.explaining import explain_images

        self._needs_weights("explain")
        explained = explain_images(self, images, methods, curves, baseline, settings, options)
        return [Explanation(caption, maps, curves_of) for caption, maps, curves_of in explained]

    def save_pretrained(self, folder: str | Path, overwrite: bool = False) -> Path:
        """Write a portable model folder (safetensors weights, configuration, vocabulary, model card)
        that ``captioning.load`` reads on any machine; see ``captioning.hub.model_folder`` and
        ``captioning.hub.save``. The folder is written as one unit (a reader sees the old model or
        the new one). A run folder, or a folder holding files that are not a model folder's, is
        refused naming them; ``overwrite=True`` replaces the model's files there and keeps the rest."""
        from captioning.hub.save import save_pretrained

        self._needs_weights("save_pretrained")
        return save_pretrained(self, folder, overwrite=overwrite)

    def export(
        self, folder: str | Path, format: str = "onnx", overwrite: bool = False, quantise: str = "none"
    ) -> Path:
        """Write the model as ONNX graphs (the encoder, the decoder's per-image work, its initial state
        and one decoding step) beside its vocabulary and configuration, each graph checked with
        ``onnx.checker``; ``captioning.load(folder, runtime="onnxruntime")`` captions with them. See
        ``captioning.export``.

        Args:
            format: ``onnx``.
            overwrite: replace an earlier export in ``folder``.
            quantise: ``none``, or ``int8`` (the decoder step's weights, for the CPU).
        Raises:
            RunFolderError: ``folder`` is a run folder, a model folder or holds other files.
            InputError: another format, or onnx is not installed (``pip install -e ".[onnx]"``).
        """
        from captioning.export.writing import export_onnx

        if format != "onnx":
            raise InputError(f"format must be onnx, got {format!r}")
        self._needs_weights("export")
        return export_onnx(self, folder, overwrite=overwrite, quantise=quantise)

    def _needs_weights(self, what: str) -> None:
        if self.runtime != "torch":
            raise InputError(
                f"{what}() needs the PyTorch weights; this model ({self.source}) runs ONNX graphs: "
                "load the checkpoint or model folder it was exported from"
            )


@overload
def load(
    path: str | Path, device: str = ..., imports: Sequence[str] = ..., runtime: Literal["torch"] = ...
) -> CaptioningModel: ...


@overload
def load(
    path: str | Path, device: str = ..., imports: Sequence[str] = ..., runtime: str = ...
) -> CaptioningModel | OnnxCaptioningModel: ...


def load(
    path: str | Path, device: str = "auto", imports: Sequence[str] = (), runtime: str = "torch"
) -> CaptioningModel | OnnxCaptioningModel:
    """Load a checkpoint written by ``train.py`` or a folder written by ``save_pretrained`` (or, with
    ``runtime="onnxruntime"``, by ``model.export``).

    Args:
        path: a run folder (``runs/shapes``: the checkpoint its test scores came from, as named in
            ``test_scores.json``'s signature, else the one ``train.py`` scores), a checkpoint file
            (``runs/shapes/checkpoints/best.pt``) or a model folder.
        device: ``auto`` (CUDA when available), ``cpu``, ``cuda`` or ``cuda:N``.
        imports: modules of your own that register the parts the checkpoint names (an encoder, a
            decoder, a scorer, a tokenizer), imported first: module names (``my_parts``) or paths to
            ``.py`` files, as the tools' ``--import`` takes them.
        runtime: ``torch``, or ``onnxruntime``: ``path`` is a folder written by ``model.export`` whose
            graphs ONNX Runtime runs on the CPU (``device`` ``auto`` or ``cpu``) with the same search
            over NumPy arrays: an ``OnnxCaptioningModel``, which needs neither torch nor torchvision
            (``pip install "captioning[onnx-runtime]"``).
    Raises:
        CheckpointError: a missing, corrupt or foreign checkpoint or folder, or weights that do not fit
            its configuration (one line naming the file).
        EncoderWeightsError: the encoder's pretrained weights cannot be found.
    """
    import_modules(list(imports), option="imports")
    if runtime not in ("torch", "onnxruntime"):
        raise InputError(f"runtime must be torch or onnxruntime, got {runtime!r}")
    if runtime == "onnxruntime":
        from captioning.export.model import OnnxCaptioningModel

        if device not in ("auto", "cpu"):
            raise InputError(
                f"runtime='onnxruntime' runs on the CPU: device must be auto or cpu, got {device!r}"
            )
        return OnnxCaptioningModel.load(path)
    from captioning.hub.checkpoint import model_path
    from captioning.inference.captioner import load_trained_captioner
    from captioning.utils.device import resolve_device

    torch_device = resolve_device(device)
    path = model_path(path)  # a run folder: the checkpoint its test scores came from
    captioner, config, reward = load_trained_captioner(path, torch_device)
    return CaptioningModel(captioner, config, torch_device, path, "scst" if reward else "xe")


def show(caption: Caption, image: ImageInput, mode: str = "bilinear") -> Figure:
    """The attention figure ``visualize.py`` draws for this caption: the image titled by the caption,
    then one overlay per word (with its beta when the decoder has a gate).

    Args:
        caption: a ``Caption`` of ``image``.
        image: the image that was captioned (any form ``caption`` takes).
        mode: ``bilinear`` or ``gaussian`` upsampling of the attention grid.
    Returns:
        A matplotlib ``Figure`` (Agg canvas): ``.savefig(path)``, or displayed as is in a notebook.
    """
    from captioning.visualization.figures import attention_figure
    from captioning.visualization.views import MODES

    if mode not in MODES:
        raise InputError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not isinstance(caption, Caption):
        raise TypeError(f"show() takes a Caption from model.caption(...), got {type(caption).__name__}")
    picture = as_rgb_image(image, "image")
    grid = caption.attention.shape[1:]
    return attention_figure(
        picture,
        caption.words,
        caption.attention,
        grid,
        text=caption.text,
        betas=caption.beta,
        mode=mode,
        attention_label=caption.attention_label,
    ).figure


__all__ = ["Caption", "CaptioningModel", "ImageError", "ImageInput", "load", "show"]
