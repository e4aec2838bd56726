"""Sanity checks for saliency maps (Adebayo et al. 2018): cascading randomisation of the decoder.

The decoder's parameters are re-initialised stage by stage, a copy of the model, cumulatively:
first every attention module (the LSTM's scorer; the Transformer's self- and cross-attention), then
the remaining top-level parts from the output layer down to the embeddings. After each stage every
method's maps of the same captions are compared with the trained model's by the Spearman rank
correlation over the cells, averaged over the words. A map that explains the model must change when
the model does: a method whose maps still correlate at ``threshold`` or more after the whole cascade is
flagged (it shows the input, not the model).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import torch
from scipy.stats import rankdata
from torch import Tensor, nn

from captioning.models.attention import Attention
from captioning.models.base import CaptionDecoder
from captioning.models.transformer import MultiHeadAttention

ATTENTION_MODULES = (Attention, MultiHeadAttention)


def randomisation_stages(decoder: nn.Module) -> list[tuple[str, list[nn.Module]]]:
    """(stage name, its modules) in cascade order: the attention modules, then the other top-level
    parts with parameters, the last defined (the output layer) first."""
    attention = [
        (name, module) for name, module in decoder.named_modules() if isinstance(module, ATTENTION_MODULES)
    ]
    stages: list[tuple[str, list[nn.Module]]] = [("attention", [module for _, module in attention])]
    for name, child in reversed(list(decoder.named_children())):
        if isinstance(child, ATTENTION_MODULES) or not any(True for _ in child.parameters()):
            continue
        stages.append((name, [child]))
    return stages


def reinitialise(modules: list[nn.Module]) -> None:
    """Every submodule's own ``reset_parameters`` (a fresh draw from its initialisation)."""
    for module in modules:
        for part in module.modules():
            reset = getattr(part, "reset_parameters", None)
            if callable(reset) and not isinstance(part, CaptionDecoder):
                reset()


def spearman(before: Tensor, after: Tensor) -> float | None:
    """Mean over the W words of the Spearman rank correlation of their maps (W, P) before and after
    (ties ranked by their mean rank); None when every word's map is constant."""
    first = rankdata(before.cpu().double().numpy(), axis=1)
    second = rankdata(after.cpu().double().numpy(), axis=1)
    first -= first.mean(axis=1, keepdims=True)
    second -= second.mean(axis=1, keepdims=True)
    norms = np.sqrt((first**2).sum(1) * (second**2).sum(1))
    valid = norms > 0
    if not valid.any():
        return None
    return float(((first * second).sum(1)[valid] / norms[valid]).mean())


def cascading_randomisation(
    decoder: CaptionDecoder,
    maps_of: Callable[[CaptionDecoder], dict[str, Tensor]],
    select: Tensor,
    threshold: float = 0.5,
    seed: int = 2018,
) -> dict[str, dict]:
    """Each method's rank correlation with its trained maps after each stage of the cascade.

    Args:
        decoder: the trained decoder (left as it is: the cascade randomises a copy).
        maps_of: a decoder -> each method's maps (B, T, P) of the same captions.
        select: (B, T) the real words.
        threshold: the correlation after the whole cascade at or above which a method is flagged.
        seed: the draws of the re-initialisation (not 0, the seed many models are built with: an
            untrained model would be re-drawn as it is).
    Returns:
        method -> ``{"stages": [...], "spearman": [one per stage], "final": the last, "flagged": bool}``.
    """
    trained = {name: maps[select] for name, maps in maps_of(decoder).items()}
    randomised = copy.deepcopy(decoder).eval()
    stages = randomisation_stages(randomised)
    correlations: dict[str, list[float | None]] = {name: [] for name in trained}
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        for _, modules in stages:
            reinitialise(modules)
            for name, maps in maps_of(randomised).items():
                correlations[name].append(spearman(trained[name], maps[select]))
    return {
        name: {
            "stages": [stage for stage, _ in stages],
            "spearman": values,
            "final": values[-1],
            "flagged": values[-1] is not None and values[-1] >= threshold,
        }
        for name, values in correlations.items()
    }
