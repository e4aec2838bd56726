"""Attribution methods: which grid cells does each word of a caption depend on?

Every method explains the score of each word, teacher-forced on the model's own caption
(:class:`captioning.explain.scoring.WordScorer`; ``ExplainConfig.score``: ``log p(w_t | w_<t, grid)``
by default, or the word's logit, or its probability), on the decoder's own (B, P) grid, returning
maps (B, T, P) for the T words of B captions:

- ``attention``: the decoder's attention map (its attention view), the map the figures draw;
- ``gradient``: gradient x input on the grid features, summed over channels (captum's
  ``InputXGradient``);
- ``integrated_gradients``: Sundararajan et al. 2017 from the baseline grid to the image's grid,
  ``ig_steps`` (at least 2) right Riemann steps, summed over channels (captum's ``IntegratedGradients``);
- ``gradcam``: Grad-CAM (Selvaraju et al. 2017) on the grid activations: each channel weighted by its
  gradient averaged over the cells, summed, negative values cut (captum's ``LayerGradCam``);
- ``occlusion``: each cell set to the baseline grid's cell in turn, the drop in the word's score;
  all words of a caption come from the same occluded passes, batched over cells (a per-word call of
  captum's ``FeatureAblation`` would repeat every pass T times);
- ``rollout``, ``chefer`` and ``gradient_rollout`` (Transformer only): attention rollout (Abnar and
  Zuidema 2020), Chefer et al. 2021's encoder-decoder relevance rules and this project's
  gradient-weighted rollout, :mod:`.transformer`.

The baseline is what a removed cell holds (``ExplainConfig.baseline``, resolved by
:mod:`captioning.explain.baselines`): by default the training split's mean grid feature in every cell
(one (C,) feature, computed once from the feature cache), or a zero feature, or the grid of the image
blurred on its pixels ((B, P, C), one per image); a caller may give any (C,) or (B, P, C) tensor.

Methods are a registry (``METHODS``): a module of your own adds one with
``@register_method("name")`` and reaches ``visualize.py --method``, ``evaluate.py --faithfulness`` and
``model.explain`` through ``--import MODULE``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType

import torch
from torch import Tensor, nn

from captioning.explain.scoring import WordScorer
from captioning.models.base import CaptionDecoder
from captioning.registry import Registry
from captioning.utils.errors import InputError
from captioning.utils.extras import extra_message


@dataclass(frozen=True)
class ExplainSettings:
    """How the methods and curves run.

    Attributes:
        ig_steps: integrated gradients' Riemann steps from the baseline to the grid (at least 2, as
            captum requires).
        batch_rows: grids per forward pass when a method or a curve runs many (occlusion, IG, curves).
    """

    ig_steps: int = 16
    batch_rows: int = 256

    def __post_init__(self) -> None:
        for name, low in (("ig_steps", 2), ("batch_rows", 1)):
            if getattr(self, name) < low:
                raise InputError(f"explain {name} must be at least {low}, got {getattr(self, name)}")


@dataclass
class ExplainInputs:
    """What a method is given.

    Attributes:
        scorer: the word scores of the B captions under their decoder.
        annotations: (B, P, C) the images' grids.
        baseline: (C,) the feature a removed cell takes in every cell, or (B, P, C) each image's own
            baseline grid (see the module docstring).
        settings: the methods' options.
    """

    scorer: WordScorer
    annotations: Tensor
    baseline: Tensor
    settings: ExplainSettings = ExplainSettings()

    @property
    def decoder(self) -> CaptionDecoder:
        return self.scorer.decoder


@dataclass(frozen=True)
class AttributionMethod:
    """A registered method: ``explain`` gives (B, T, P) maps (0 after each caption's end);
    ``unsupported`` says why a decoder cannot be explained by it (None when it can); ``baseline``
    whether it reads ``ExplainInputs.baseline`` (when no method asked for and no curve does, none is
    computed)."""

    explain: Callable[[ExplainInputs], Tensor]
    unsupported: Callable[[CaptionDecoder], str | None] = lambda decoder: None
    description: str = ""
    baseline: bool = True
    needs_captum: bool = False  # it calls captum (the explain extra), checked before any work


METHODS: Registry[AttributionMethod] = Registry("attribution method", key="--method")


def register_method(
    name: str,
    unsupported: Callable[[CaptionDecoder], str | None] | None = None,
    description: str = "",
    baseline: bool = True,
    needs_captum: bool = False,
) -> Callable[[Callable[[ExplainInputs], Tensor]], Callable[[ExplainInputs], Tensor]]:
    """Decorator registering a function ``ExplainInputs -> (B, T, P) maps`` as the method ``name``
    (``baseline=False``: it never reads ``ExplainInputs.baseline``; ``needs_captum``: it calls captum,
    which the tools check for before any work)."""

    def add(function: Callable[[ExplainInputs], Tensor]) -> Callable[[ExplainInputs], Tensor]:
        doc = (function.__doc__ or "").strip().splitlines()
        METHODS.add(
            name,
            AttributionMethod(
                function,
                unsupported or (lambda decoder: None),
                description or (doc[0] if doc else ""),
                baseline,
                needs_captum,
            ),
        )
        return function

    return add


def check_extras(names: Sequence[str], option: str = "--method") -> None:
    """Refuse, before any work, methods whose library is not installed (captum: the explain extra).

    Raises:
        InputError: naming ``option``, the methods and the extra that installs their library.
    """
    needing = [name for name in names if METHODS[name].needs_captum]
    if needing and importlib.util.find_spec("captum") is None:
        raise InputError(
            f'{option}: {", ".join(needing)} need captum: pip install -e ".[explain]" '
            "(or name methods without it: attention, occlusion)"
        )


def needs_baseline(methods: Sequence[str], curves: bool) -> bool:
    """Whether explaining with ``methods`` (and, with ``curves``, their curves) reads a baseline."""
    return curves or any(METHODS[name].baseline for name in methods)


def parse_methods(text: str, decoder: CaptionDecoder | None = None) -> tuple[str, ...]:
    """``"attention,gradcam"`` -> the names, each registered (and, given a decoder, able to explain it).

    Raises:
        InputError: an empty list, or a method that cannot explain ``decoder``.
        UnknownNameError: an unregistered name, listing the registered ones.
    """
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise InputError(f"--method: no method named in {text!r}; registered: {', '.join(METHODS.names())}")
    for name in names:
        METHODS.check(name)
        reason = METHODS[name].unsupported(decoder) if decoder is not None else None
        if reason:
            raise InputError(f"--method {name}: {reason}")
    return tuple(dict.fromkeys(names))


def applicable_methods(decoder: CaptionDecoder) -> tuple[str, ...]:
    """The registered methods that can explain ``decoder``."""
    return tuple(name for name, method in METHODS.items() if method.unsupported(decoder) is None)


def captum() -> ModuleType:
    """``captum.attr``, imported on first use.

    Raises:
        InputError: captum is not installed, naming the extra that installs it.
    """
    try:
        import captum.attr
    except ImportError:
        raise InputError(extra_message("explain", "attribution methods")) from None
    return captum.attr


def explain(name: str, inputs: ExplainInputs) -> Tensor:
    """The maps (B, T, P) of method ``name``, float32, 0 after each caption's end.

    Raises:
        InputError: the method cannot explain this decoder.
    """
    method = METHODS[name]
    reason = method.unsupported(inputs.decoder)
    if reason:
        raise InputError(f"method {name}: {reason}")
    maps = method.explain(inputs).detach().float()
    expected = (inputs.scorer.images, inputs.scorer.words, inputs.annotations.size(1))
    if tuple(maps.shape) != expected:
        raise ValueError(f"method {name} returned maps of shape {tuple(maps.shape)}, expected {expected}")
    return maps * inputs.scorer.word_mask.unsqueeze(-1)


def _per_word(
    inputs: ExplainInputs, attribute: Callable[[Callable[[Tensor], Tensor], int], Tensor]
) -> Tensor:
    """Stack ``attribute(word_function, t)`` (B, P) over the T words -> (B, T, P)."""
    with torch.enable_grad():
        return torch.stack(
            [attribute(inputs.scorer.word(t), t).detach() for t in range(inputs.scorer.words)], dim=1
        )


@register_method("attention", baseline=False)
def attention_maps(inputs: ExplainInputs) -> Tensor:
    """The decoder's own attention map of each word (its attention view)."""
    scorer = inputs.scorer
    with torch.no_grad():
        output = inputs.decoder(inputs.annotations, scorer.captions, scorer.lengths)
    return output.alphas[:, : scorer.words].float()


@register_method("gradient", baseline=False, needs_captum=True)
def gradient_x_input(inputs: ExplainInputs) -> Tensor:
    """Gradient x input on the grid features, summed over channels."""
    attr = captum()

    def one(function: Callable[[Tensor], Tensor], t: int) -> Tensor:
        grid = inputs.annotations.detach().clone().requires_grad_(True)
        return attr.InputXGradient(function).attribute(grid).sum(-1)  # (B, P)

    return _per_word(inputs, one)


def baseline_grid(baseline: Tensor, annotations: Tensor) -> Tensor:
    """(B, P, C): a (C,) baseline in every cell, or a (B, P, C) one as it is."""
    return baseline.to(annotations).expand_as(annotations).contiguous()


@register_method("integrated_gradients", needs_captum=True)
def integrated_gradients(inputs: ExplainInputs) -> Tensor:
    """Integrated gradients from the baseline grid, summed over channels."""
    attr = captum()
    baseline = baseline_grid(inputs.baseline, inputs.annotations)
    per_pass = max(1, inputs.settings.batch_rows // inputs.scorer.images)

    def one(function: Callable[[Tensor], Tensor], t: int) -> Tensor:
        method = attr.IntegratedGradients(function)
        attributions = method.attribute(
            inputs.annotations.detach(),
            baselines=baseline,
            n_steps=inputs.settings.ig_steps,
            method="riemann_right",
            internal_batch_size=per_pass * inputs.scorer.images,
        )
        return attributions.sum(-1)  # (B, P)

    return _per_word(inputs, one)


class _GridActivations(nn.Module):
    """The grid as a layer's output (B, C, P), so Grad-CAM pools gradients over the P cells."""

    def forward(self, annotations: Tensor) -> Tensor:
        return annotations.transpose(1, 2)


@register_method("gradcam", baseline=False, needs_captum=True)
def gradcam(inputs: ExplainInputs) -> Tensor:
    """Grad-CAM on the grid activations, negative values cut."""
    attr = captum()
    layer = _GridActivations()

    def one(function: Callable[[Tensor], Tensor], t: int) -> Tensor:
        def through_layer(annotations: Tensor) -> Tensor:
            return function(layer(annotations).transpose(1, 2))

        cam = attr.LayerGradCam(through_layer, layer).attribute(
            inputs.annotations.detach(), relu_attributions=True
        )  # (B, 1, P)
        return cam.squeeze(1)

    return _per_word(inputs, one)


@register_method("occlusion")
def occlusion(inputs: ExplainInputs) -> Tensor:
    """The drop in the word's score when its cell is set to the baseline's."""
    scorer, annotations = inputs.scorer, inputs.annotations
    images, cells, _ = annotations.shape
    baseline = baseline_grid(inputs.baseline, annotations)
    with torch.no_grad():
        full = scorer.all_words(annotations)  # (B, T)
        drops = full.new_zeros(images, scorer.words, cells)
        per_pass = max(1, inputs.settings.batch_rows // images)
        for first in range(0, cells, per_pass):
            chosen = torch.arange(first, min(cells, first + per_pass), device=annotations.device)  # (K,)
            # (K, B, P, C): copy k has cell chosen[k] of every image set to the baseline's
            occluded = annotations.unsqueeze(0).repeat(chosen.numel(), 1, 1, 1)
            occluded[torch.arange(chosen.numel()), :, chosen] = baseline[:, chosen].transpose(0, 1)
            scores = scorer.all_words(occluded.flatten(0, 1)).view(chosen.numel(), images, -1)  # (K, B, T)
            drops[:, :, chosen] = (full.unsqueeze(0) - scores).permute(1, 2, 0)
    return drops
