"""The explanation settings, declared once: :class:`ExplainConfig`.

Every option of the attribution methods, the deletion and insertion curves and the faithfulness
study is a field of one frozen dataclass. From it come, without a second list anywhere:

- its checks (types, ranges, choices and what each count costs), at construction;
- ``evaluate.py``'s flags (:func:`add_explain_flags`, :func:`config_from_flags`): a field whose
  metadata says ``flag=True`` is a flag ``--field-name`` of its type, with its help and choices;
- the ``faith:`` part of the scores' signature (:func:`signature_part`): every field but the
  speed-only ones, a short form where one reads better, any other (a new field) as ``name=value``
  whenever it differs from its default;
- ``model.explain``'s keyword arguments (any field by name).

A subclass with fields of its own gets all four (``tests/explain/test_explain_config.py`` adds one).
"""

from __future__ import annotations

import argparse
import math
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

from captioning.utils.errors import InputError

if typing.TYPE_CHECKING:
    from captioning.explain.pixel_curves import PixelCurveSettings

SCORES = ("log_prob", "logit", "prob")
"""What each method explains for a word w_t: ``log p(w_t | w_<t, grid)``, the word's logit before the
softmax, or its probability."""

BASELINES = ("dataset_mean", "zeros", "blur")
"""What a removed cell holds: the training split's mean grid feature, a zero feature, or the cell of
the grid of the image blurred on its pixels."""

MAX_ROWS_PER_WORD = 100_000
"""Decoder passes (one caption's prefix under one grid) the settings may cost per explained word:
about 500 times the defaults' cost (192 passes). A count beyond it would run for hours on a handful
of images."""

CAPTUM_STEP_BYTES = 64
"""Bytes integrated gradients holds per step before its first pass (captum's lists of step sizes and
path positions, Python floats)."""

SANITY_RANDOMISATIONS = ("both", "cascading")
"""Which of Adebayo et al.'s model parameter randomisations run: the cascading one and the independent
one (each layer group alone), or the cascading one alone."""

DEFAULT_METHODS = ("attention", "gradient", "integrated_gradients", "gradcam", "occlusion")


def _option(default: Any, help: str, flag: bool = True, choices: tuple = (), **extra: Any) -> Any:
    """A field with its flag's help and choices in its metadata."""
    return field(default=default, metadata={"flag": flag, "help": help, "choices": choices, **extra})


@dataclass(frozen=True)
class ExplainConfig:
    """How words are explained and the explanations measured (``evaluate.py --faithfulness``,
    ``model.explain``, ``visualize.py --method``). Validated at construction; see the module docstring
    for what is derived from the fields."""

    methods: tuple[str, ...] = _option(DEFAULT_METHODS, "attribution methods (METHODS names)", flag=False)
    ig_steps: int = _option(16, "integrated gradients' right Riemann steps (at least 2)")
    curve_steps: int = _option(10, "points of each deletion and insertion curve after the first")
    random_seeds: int = _option(3, "random orders of the control")
    sanity_images: int = _option(8, "images of Adebayo et al.'s randomisation tests (0: none)")
    sanity_threshold: float = _option(
        0.5,
        "this project's flag (Adebayo et al. set none): the absolute-value rank correlation after the "
        "whole cascade at or above which a method is flagged",
        flag=False,
    )
    score: str = _option(
        "log_prob",
        "what each method explains for a word: log_prob (log p(word | prefix, grid)), logit (the "
        "word's score before the softmax, as Grad-CAM and Chefer et al. differentiate) or prob",
        choices=SCORES,
    )
    baseline: str = _option(
        "dataset_mean",
        "what a removed cell holds in integrated gradients, occlusion and the curves: dataset_mean "
        "(the training split's mean grid feature, computed once and kept in the run folder), zeros, "
        "or blur (the cell of the image blurred on its pixels, Gaussian sigma 10/224 of its shorter side)",
        choices=BASELINES,
    )
    order_seed: int = _option(
        0, "seed of the random orders: the order of cells a map ties, and the control's orders"
    )
    batch_images: int = _option(8, "images explained together", flag=False)
    batch_rows: int = _option(256, "grids per forward pass of a method or a curve", flag=False)
    pointing_tolerance: float = _option(
        15.0, "the published pointing game's tolerance in pixels (data.pointing_tolerance)", flag=False
    )
    sanity_randomisation: str = _option(
        "both",
        "the model parameter randomisation: both (cascading, then each layer group alone) or cascading "
        "(half the cost)",
        choices=SANITY_RANDOMISATIONS,
    )
    similarity_size: int = _option(
        224,
        "image side in pixels the maps are stretched to for SSIM and HOG (the model's image size)",
        flag=False,
    )
    # RISE's protocol in pixel space beside the grid curves (captioning.explain.pixel_curves)
    pixel_steps: int = _option(
        0,
        "also RISE's deletion and insertion in pixel space, in this many steps (0: the grid curves only; "
        "RISE: 224): the map upsampled to the image, the encoder in the loop (docs/faithfulness.md)",
    )
    pixel_deletion_value: float = _option(
        0.0, "what a deleted pixel becomes, in the encoder's normalised units (0: the mean colour, RISE's)"
    )

    def __post_init__(self) -> None:
        _check_types(self)
        if not self.methods:
            raise InputError("explain methods: name at least one method")
        for name in ("score", "baseline", "sanity_randomisation"):
            choices = fields_by_name(type(self))[name].metadata["choices"]
            if getattr(self, name) not in choices:
                raise InputError(
                    f"explain {name} must be one of {', '.join(choices)}, got {getattr(self, name)!r}"
                )
        _at_least(self, "ig_steps", 2, "captum's integrated gradients needs two steps or more")
        for name in ("curve_steps", "random_seeds", "batch_images", "batch_rows"):
            _at_least(self, name, 1)
        for name in ("sanity_images", "order_seed", "pixel_steps"):
            _at_least(self, name, 0)
        for name, (low, closed, high, what) in _RANGES.items():
            value = getattr(self, name)
            above = value >= low if closed else value > low
            if not (math.isfinite(value) and above and value <= high):
                raise InputError(f"explain {name} must be {what}, got {value!r}")
        _at_least(self, "similarity_size", 24, "HOG's blocks are 3x3 cells of 8 pixels")
        if not math.isfinite(self.pixel_deletion_value):
            raise InputError(
                f"explain pixel_deletion_value must be a finite number, got {self.pixel_deletion_value!r}"
            )
        self._check_cost()

    @property
    def pixel(self) -> PixelCurveSettings | None:
        """The pixel-space curves' settings (None with ``pixel_steps`` 0)."""
        from captioning.explain.pixel_curves import PixelCurveSettings

        if not self.pixel_steps:
            return None
        return PixelCurveSettings(steps=self.pixel_steps, deletion_value=self.pixel_deletion_value)

    def rows_per_word(self) -> int:
        """Decoder passes per explained word that the counts cost: integrated gradients' steps, and
        each curve's points (deletion and insertion) for every method and every seed of the control
        (occlusion's one pass per cell and the cascading randomisation come on top, bounded by the grid
        and the images)."""
        return _rows(self.ig_steps, self.curve_steps, self.random_seeds, len(self.methods))

    def _check_cost(self) -> None:
        total = self.rows_per_word()
        if total <= MAX_ROWS_PER_WORD:
            return
        # name the count whose own value costs the most: the one that, back at its default, saves most
        counts = ("ig_steps", "curve_steps", "random_seeds")
        defaults = fields_by_name(type(self))
        saved = {
            key: total
            - _rows(
                **{**{k: getattr(self, k) for k in counts}, key: defaults[key].default},
                methods=len(self.methods),
            )
            for key in counts
        }
        key = max(counts, key=lambda name: saved[name])
        raise InputError(
            f"explain {_named(self, key)} {getattr(self, key)} makes each explained word cost "
            f"about {total:,} decoder passes, more than {MAX_ROWS_PER_WORD:,}: lower it"
        )


# The real-valued fields' ranges (low, low included, high): a rank correlation, and the pointing game's
# radius (as data.pointing_tolerance bounds it: above 0, at most 1e6 pixels).
_RANGES = {
    "sanity_threshold": (-1.0, True, 1.0, "a rank correlation in [-1, 1]"),
    "pointing_tolerance": (0.0, False, 1e6, "a number of pixels in (0, 1e6]"),
}


def _rows(ig_steps: int, curve_steps: int, random_seeds: int, methods: int) -> int:
    return ig_steps + 2 * (curve_steps + 1) * (methods + random_seeds)


def fields_by_name(cls: type) -> dict[str, Field]:
    return {item.name: item for item in fields(cls)}


def flag_name(name: str) -> str:
    """``ig_steps`` -> ``--ig-steps``."""
    return "--" + name.replace("_", "-")


def _named(config: ExplainConfig, name: str) -> str:
    """``ig_steps (--ig-steps)`` for a field with a flag, else the field's name."""
    flagged = fields_by_name(type(config))[name].metadata.get("flag")
    return f"{name} ({flag_name(name)})" if flagged else name


def _at_least(config: ExplainConfig, name: str, low: int, why: str = "") -> None:
    value = getattr(config, name)
    if value < low:
        raise InputError(
            f"explain {_named(config, name)} must be at least {low}, got {value}"
            + (f": {why}" if why else "")
        )


def _check_types(config: ExplainConfig) -> None:
    """Every field holds its declared type: an int field an int (not a bool, not 2.5, NaN or '16'), a
    float field a real number, a str field a str, a tuple of str a tuple of str."""
    hints = typing.get_type_hints(type(config))
    for item in fields(config):
        value, hint = getattr(config, item.name), hints[item.name]
        if hint is int and (not isinstance(value, int) or isinstance(value, bool)):
            raise InputError(f"explain {_named(config, item.name)} must be an integer, got {value!r}")
        if hint is float and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise InputError(f"explain {item.name} must be a number, got {value!r}")
        if hint is str and not isinstance(value, str):
            raise InputError(f"explain {item.name} must be a string, got {value!r}")
        if typing.get_origin(hint) is tuple and (
            not isinstance(value, tuple) or not all(isinstance(one, str) for one in value)
        ):
            raise InputError(f"explain {item.name} must be a tuple of names, got {value!r}")


# How a field is written in the signature when a short form reads better than ``name=value`` (the
# images explained, ``n``, are not a setting and follow the sanity check's part).
_SIGNATURE_PARTS: dict[str, Callable[[Any], str | None]] = {
    "methods": lambda c: "+".join(c.methods),
    "ig_steps": lambda c: f"ig{c.ig_steps}",
    "curve_steps": lambda c: f"steps{c.curve_steps}",
    "random_seeds": lambda c: f"seeds{c.random_seeds}",
    "sanity_images": lambda c: f"sanity{c.sanity_images}@{c.sanity_threshold:g}",
    "sanity_threshold": lambda c: None,  # with sanity_images
    "pointing_tolerance": lambda c: f"point{c.pointing_tolerance:g}px",
    "similarity_size": lambda c: f"sim{c.similarity_size}px",
}
# Fields that change how fast the study runs, never its numbers.
_NOT_IN_SIGNATURE = frozenset({"batch_images", "batch_rows"})


def signature_part(config: ExplainConfig, images: int, baseline: str | None = None) -> str:
    """The settings as one signature value (no ``|`` or ``:``), e.g.
    ``attention+gradcam,ig16,steps10,seeds3,sanity8@0.5,n200,score=log_prob,
    baseline=dataset_mean.3f2a9c01d4e5,order_seed=0,point15px``.

    Args:
        images: how many images were explained.
        baseline: the baseline as it was resolved (the training mean's hash), else ``config.baseline``.
    """
    parts = []
    for item in fields(config):
        name, value = item.name, getattr(config, item.name)
        if name in _NOT_IN_SIGNATURE:
            continue
        if name in _SIGNATURE_PARTS:
            part = _SIGNATURE_PARTS[name](config)
        elif name == "baseline":
            part = f"baseline={baseline or value}"
        elif name in ("score", "order_seed"):
            part = f"{name}={value}"
        elif value != _default(item):
            part = f"{name}={value:g}" if isinstance(value, float) else f"{name}={value}"
        else:
            part = None
        if part is not None:
            parts.append(part)
        if name == "sanity_images":
            parts.append(f"n{images}")
    return ",".join(part.replace("|", "/").replace(":", "/") for part in parts)


def _default(item: Field) -> Any:
    return item.default_factory() if item.default_factory is not MISSING else item.default


def add_explain_flags(group: Any, cls: type[ExplainConfig] = ExplainConfig) -> None:
    """One flag per field of ``cls`` whose metadata says ``flag``: ``--name`` of the field's type, its
    choices, and its help with the default. No default is set on the parser (a flag not given leaves
    the field's own), so the dataclass stays the one place defaults live."""
    hints = typing.get_type_hints(cls)
    for item in fields(cls):
        if not item.metadata.get("flag"):
            continue
        hint = hints[item.name]
        kind = hint if hint in (int, float, str) else str
        choices = item.metadata.get("choices") or None
        group.add_argument(
            flag_name(item.name),
            dest=f"explain_{item.name}",
            type=kind,
            choices=choices,
            default=None,
            metavar=None if choices else item.name.upper(),
            help=f"{item.metadata.get('help', '')} (default: {_default(item)})".replace("%", "%%"),
        )


def config_from_flags(
    args: argparse.Namespace, cls: type[ExplainConfig] = ExplainConfig, **given: Any
) -> ExplainConfig:
    """``cls`` from the flags :func:`add_explain_flags` made (those given) and ``given`` values."""
    values = {
        item.name: getattr(args, f"explain_{item.name}")
        for item in fields(cls)
        if item.metadata.get("flag") and getattr(args, f"explain_{item.name}", None) is not None
    }
    return cls(**{**values, **given})


def config_with(config: ExplainConfig, options: Mapping[str, Any]) -> ExplainConfig:
    """``config`` with ``options`` (field names) changed, validated as one of its class.

    Raises:
        InputError: a name that is no field (listing the fields), or an invalid value.
    """
    names = [item.name for item in fields(config)]
    unknown = sorted(set(options) - set(names))
    if unknown:
        raise InputError(
            f"unknown explain option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: the options "
            f"are {', '.join(names)}"
        )
    from dataclasses import replace

    return replace(config, **options)
