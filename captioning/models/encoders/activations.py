"""What an encoder's pass costs in memory, measured on meta tensors before any pixel is read.

``Encoder`` runs its backbone once on a meta image of its size to learn its channels and grid; the
same pass, under :class:`ActivationMeter`, records every tensor an operation creates and when it is
freed. Its peak is the memory the activations of one image take at once (``torch.no_grad``: caching
and captioning), its total the memory they take when all are kept for the backward pass (an
upper bound for fine-tuning). A batch of B images takes about B times either.
:func:`check_encoder_fits` compares that with the memory free before the first batch, so that an
``image_size`` of 4,096 pixels is one line naming the key instead of the kernel killing the run.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from captioning.config import ConfigError
from captioning.utils.memory import available_bytes, gib


class ActivationMeter(TorchDispatchMode):
    """Counts the bytes of the tensors created while it is active (views and in-place results share
    their input's memory and are not counted), freed when their last reference goes.

    Attributes:
        peak: the most bytes alive at once since the meter started.
        total: the bytes of every tensor created (all kept: a backward pass's bound).
    """

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = self.total = 0

    def _free(self, size: int) -> None:
        self.live -= size

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func.is_view or func._schema.is_mutable:  # aliases of an input: no new memory
            return out
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor):
                size = tensor.numel() * tensor.element_size()
                self.live += size
                self.total += size
                weakref.finalize(tensor, self._free, size)
        self.peak = max(self.peak, self.live)
        return out


def check_encoder_fits(
    encoder: Any, images: int, device: torch.device, batch_key: str | None, training: bool = False
) -> None:
    """Refuse, before any work, encoder passes over ``images`` images at once whose activations do not
    fit in the memory free on ``device``.

    Args:
        encoder: an ``Encoder`` (its ``activation_bytes``: the peak and total of one image, measured
            at its ``image_size``); one that does not measure them (an ONNX export's) is not checked.
        images: images per pass.
        batch_key: the key setting ``images``, named in the message as the other fix; None where
            nothing sets it (the feature cache's batches).
        training: the pass keeps its activations for a backward pass (a fine-tuned encoder).
    Raises:
        ConfigError: one line naming ``model.encoder.image_size``, the estimate, what is free and
            the keys to lower.
    """
    measured = getattr(encoder, "activation_bytes", None)
    if measured is None:
        return
    peak, total = measured
    each = total if training else peak
    needed = max(images, 1) * each
    free = available_bytes(device)
    if free is None or needed <= free:
        return
    kept = " kept for fine-tuning" if training else ""
    raise ConfigError(
        f"model.encoder.image_size {encoder.image_size}: {encoder.name}'s activations{kept} for "
        f"{images} image{'s' * (images != 1)} per pass need about {gib(needed)} ({gib(each)} each), "
        f"more than the {gib(free)} free on {device}; lower model.encoder.image_size"
        + (f" or {batch_key}" if batch_key and images > 1 else "")
    )
