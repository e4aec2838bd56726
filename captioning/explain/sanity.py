"""The model parameter randomisation test of Adebayo et al. 2018 ("Sanity Checks for Saliency Maps").

A copy of the model has its learned parameters re-drawn from their initialisation, layer group by
layer group, and each method's maps of the same captions are compared with the trained model's after
each stage by the four measures of :mod:`captioning.explain.similarity`:

- **cascading**: from the output layer down, each stage adding the next group to those re-drawn
  before it (the paper's Figure 2);
- **independent**: one group at a time, every other parameter as trained (the paper's section 4.1
  "independent randomization").

The stages come from the model's own modules, top down: for the LSTM the output layer (L_o), the
deep-output layers (L_h, L_z), the recurrence (the LSTM's gates and its initial-state layers), the
attention (the scorer and the gate f_beta), the embeddings; for the Transformer the output layer
(its final LayerNorm with it), each decoder block from the last, the embeddings, each grid-encoder
block from the last, and the grid projection. A parameter two modules share (the Transformer's output
layer tied to the embeddings) is re-drawn at the first stage that holds it. A decoder family of your
own is split into its top-level parts with parameters, the last registered first, unless it
registers its stages with :func:`register_stages`.

A re-drawn parameter takes the value a fresh draw of the whole model gives it: every module's own
``reset_parameters``, children before parents as constructing the model runs them (so the decoders'
own initialisations hold: the LSTM's embeddings U(-0.1, 0.1), the Transformer's Glorot matrices), from
``seed``; a parameter no module re-initialises is drawn from a normal with the trained tensor's mean and
standard deviation. The paper sets no threshold and reports the curves; this project's own flag
(``threshold``) marks a method whose absolute-value rank correlation is still at or above it after
the whole cascade.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from captioning.explain.similarity import MEASURES, Reference, summary
from captioning.models.base import CaptionDecoder
from captioning.models.decoder import ShowAttendTellDecoder
from captioning.models.transformer import TransformerDecoder

Model = TypeVar("Model", bound=nn.Module)


@dataclass(frozen=True)
class Stage:
    """One step of the randomisation: its name and the parameters it re-draws (``named_parameters``
    names of the model, a shared parameter under its first name)."""

    name: str
    parameters: tuple[str, ...]


# A family's stages, top down: decoder -> (stage name, its modules) in cascade order.
StageModules = Callable[[nn.Module], list[tuple[str, list[nn.Module]]]]
STAGES: dict[type, StageModules] = {}


def register_stages(family: type) -> Callable[[StageModules], StageModules]:
    """Decorator: ``function(decoder) -> [(stage name, [modules])]``, top down, is how the decoders of
    class ``family`` (and its subclasses) are randomised."""

    def add(function: StageModules) -> StageModules:
        STAGES[family] = function
        return function

    return add


def _present(*modules: nn.Module | None) -> list[nn.Module]:
    return [module for module in modules if module is not None]


@register_stages(ShowAttendTellDecoder)
def lstm_stages(decoder: nn.Module) -> list[tuple[str, list[nn.Module]]]:
    """Output layer, deep output, recurrence, attention, embeddings (equations 4 to 7 read backwards)."""
    assert isinstance(decoder, ShowAttendTellDecoder)
    stages: list[tuple[str, list[nn.Module]]] = [("output layer", [decoder.out])]
    if decoder.deep_output:
        stages.append(("deep output", [decoder.hidden_to_out, decoder.context_to_out]))
    recurrence: list[nn.Module] = [decoder.recurrent_to_gates, decoder.embed_to_gates, decoder.init_h]
    stages.append(("recurrence", [*recurrence, decoder.init_c, decoder.init_mlp]))
    stages.append(("attention", _present(decoder.attention, decoder.gate)))
    stages.append(("embeddings", [decoder.embedding]))
    return stages


@register_stages(TransformerDecoder)
def transformer_stages(decoder: nn.Module) -> list[tuple[str, list[nn.Module]]]:
    """Output layer, decoder blocks from the last, embeddings, grid-encoder blocks from the last, the
    grid projection."""
    assert isinstance(decoder, TransformerDecoder)
    tied = decoder.out.weight is decoder.embedding.weight
    output = "output layer (tied to the embeddings)" if tied else "output layer"
    stages: list[tuple[str, list[nn.Module]]] = [(output, [decoder.out, decoder.final_norm])]
    blocks = list(decoder.blocks)
    stages += [(f"decoder block {index + 1}", [blocks[index]]) for index in reversed(range(len(blocks)))]
    stages.append(("embeddings", [decoder.embedding]))
    encoder = list(decoder.grid_encoder)
    stages += [
        (
            f"grid encoder block {index + 1}",
            [encoder[index], *([decoder.grid_norm] if index == len(encoder) - 1 else [])],
        )
        for index in reversed(range(len(encoder)))
    ]
    stages.append(("grid projection", [decoder.grid_projection]))
    return stages


def _generic_stages(decoder: nn.Module) -> list[tuple[str, list[nn.Module]]]:
    """Each top-level part with parameters, the last registered first."""
    return [(name, [child]) for name, child in reversed(list(decoder.named_children()))]


def randomisation_stages(decoder: nn.Module) -> list[Stage]:
    """The decoder's stages, top down, each with the parameter names it re-draws; parameters no stage
    names (a part a subclass adds) are appended as a stage per top-level part."""
    family = next((STAGES[cls] for cls in type(decoder).__mro__ if cls in STAGES), _generic_stages)
    names = {id(parameter): name for name, parameter in decoder.named_parameters()}
    taken: set[int] = set()
    stages = []
    for name, modules in [*family(decoder), *_generic_stages(decoder)]:
        chosen = [p for module in modules for p in module.parameters() if id(p) not in taken]
        unique = list({id(p): p for p in chosen}.values())
        if unique:
            taken.update(id(p) for p in unique)
            stages.append(Stage(name, tuple(names[id(p)] for p in unique)))
    return stages


def _reset_in_construction_order(module: nn.Module) -> None:
    for child in module.children():
        _reset_in_construction_order(child)
    reset = getattr(module, "reset_parameters", None)
    if callable(reset):
        reset()


def fresh_parameters(model: nn.Module, seed: int) -> dict[str, Tensor]:
    """Name -> a fresh draw of every parameter of ``model`` from its initialisation (on the CPU, from
    ``seed``, whatever device the model is on): see the module docstring."""
    fresh = copy.deepcopy(model).cpu()
    covered = {
        id(parameter)
        for module in fresh.modules()
        if callable(getattr(module, "reset_parameters", None))
        for parameter in module.parameters(recurse=False)
    }
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        _reset_in_construction_order(fresh)
        for parameter in fresh.parameters():
            if id(parameter) not in covered:
                values = parameter.detach().double()
                spread = float(values.std()) if values.numel() > 1 else abs(float(values))
                parameter.normal_(float(values.mean()), spread)
    return {name: parameter.detach() for name, parameter in fresh.named_parameters()}


def randomised(model: Model, stages: Iterable[Stage], fresh: dict[str, Tensor]) -> Model:
    """A copy of ``model`` (eval mode) whose parameters of ``stages`` hold their fresh draws."""
    copied = copy.deepcopy(model).eval()
    parameters = dict(copied.named_parameters())
    with torch.no_grad():
        for stage in stages:
            for name in stage.parameters:
                parameters[name].copy_(fresh[name])
    return copied


def _selected(maps: dict[str, Tensor], select: Tensor) -> dict[str, Tensor]:
    return {name: value[select] for name, value in maps.items()}


def randomisation_test(
    decoder: CaptionDecoder,
    maps_of: Callable[[CaptionDecoder], dict[str, Tensor]],
    select: Tensor,
    grid: tuple[int, int],
    size: int,
    independent: bool = True,
    threshold: float = 0.5,
    seed: int = 2018,
    stages: Sequence[Stage] | None = None,
) -> dict:
    """Each method's similarity to its trained maps after each stage, cascading and independent.

    Args:
        decoder: the trained decoder (left as it is: the stages randomise copies).
        maps_of: a decoder -> each method's maps (B, T, P) of the same captions.
        select: (B, T) the real words.
        grid: (gh, gw), P = gh * gw; size: the image side for SSIM and HOG.
        independent: also re-draw each stage alone.
        threshold: this project's flag on the absolute-value rank correlation after the whole cascade.
        seed: the fresh draw (not 0, the seed many models are built with: an untrained model would be
            re-drawn as it is).
        stages: the stages (default: :func:`randomisation_stages`).
    Returns:
        ``{"stages", "parameters" (stage -> names), "words", "size", "seed", "cascading": {method:
        {measure: [per stage], "words_<measure>": [per stage]}}, "independent": (the same),
        "flag": {"measure", "threshold", method: bool}}`` (JSON values).
    """
    stages = list(stages) if stages is not None else randomisation_stages(decoder)
    trained = _selected(maps_of(decoder), select)
    references = {name: Reference(maps, grid, size) for name, maps in trained.items()}
    fresh = fresh_parameters(decoder, seed)
    variants = {"cascading": [stages[: index + 1] for index in range(len(stages))]}
    if independent:
        variants["independent"] = [[stage] for stage in stages]
    result: dict = {
        "stages": [stage.name for stage in stages],
        "parameters": {stage.name: list(stage.parameters) for stage in stages},
        "words": int(select.sum()),
        "size": size,
        "seed": seed,
    }
    for variant, chosen in variants.items():
        curves: dict[str, dict[str, list]] = {name: {} for name in trained}
        for drawn in chosen:
            after = _selected(maps_of(randomised(decoder, drawn, fresh)), select)
            for name, reference in references.items():
                for key, value in summary(reference.compare(after[name])).items():
                    curves[name].setdefault(key, []).append(value)
        result[variant] = curves
    final = {name: result["cascading"][name]["spearman_abs"][-1] for name in trained}
    result["flag"] = {
        "measure": "spearman_abs",
        "threshold": threshold,
        **{name: value is not None and value >= threshold for name, value in final.items()},
    }
    return result


def final_similarities(result: dict, method: str) -> dict[str, float | None]:
    """A method's four measures after the whole cascade (``sanity_<measure>`` rows of the table)."""
    curves = result["cascading"][method]
    return {f"sanity_{measure}": curves[measure][-1] for measure in MEASURES}


def stage_curve(result: dict, method: str, measure: str, variant: str = "cascading") -> np.ndarray:
    """(S,) a method's measure per stage (NaN where undefined), for figures."""
    return np.array([np.nan if v is None else v for v in result[variant][method][measure]], dtype=float)


def data_randomisation_test(
    trained: dict[str, Tensor], shuffled: dict[str, Tensor], select: Tensor, grid: tuple[int, int], size: int
) -> dict:
    """Adebayo et al.'s data randomisation test: each method's maps (B, T, P) of the same captions under
    the trained model and under one trained on captions shuffled across images
    (``data.shuffle_captions``), compared by the four measures.

    Returns:
        ``{"words", "size", "methods": {method: {measure: mean over words, "words_<measure>": n}}}``.
    """
    return {
        "words": int(select.sum()),
        "size": size,
        "methods": {
            name: summary(Reference(maps[select], grid, size).compare(shuffled[name][select]))
            for name, maps in trained.items()
        },
    }
