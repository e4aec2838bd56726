"""What a faithfulness study will cost, said before it runs: images, words, methods, passes, seconds.

The passes are counted from the settings and the captions (rows through the decoder, each a caption's
prefix or whole caption, some also run backward); the seconds are an estimate: a short
calibration times one forward pass, and one forward and backward pass, of ``batch_rows`` rows of the
study's own grids and captions on its device (and, for the pixel curves, one encoder pass), and every
part is priced at those rates. The calibration takes about a second; the estimate is only as good as
the machine is steady while the study runs (another job on the same cores slows it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from captioning.explain.pixel_curves import change_counts
from captioning.explain.sanity import randomisation_stages
from captioning.explain.scoring import WordScorer, caption_tensor
from captioning.explain.similarity import Reference
from captioning.models.base import CaptionDecoder

# rows through the decoder per explained word (forward only, forward and backward), per method;
# a method of one's own (``register_method``) is priced as a gradient method
FORWARD_PER_WORD = {"occlusion": 0.0}
BACKWARD_PER_WORD = {"attention": 0.0, "rollout": 0.0, "occlusion": 0.0}


@dataclass
class StudyPlan:
    """The study's size and its estimated cost.

    Attributes:
        images, words: what is explained.
        methods: the methods.
        forward_rows, backward_rows: part -> decoder rows run forward only / forward and backward.
        encoder_images: images through the encoder (the pixel curves).
        similarity_words: words' maps compared by the randomisation tests' four measures (each a
            stretch of both maps to ``similarity_size`` pixels, HOG and SSIM).
        seconds: part -> estimated seconds (empty without a calibration).
    """

    images: int
    words: int
    methods: tuple[str, ...]
    forward_rows: dict[str, int] = field(default_factory=dict)
    backward_rows: dict[str, int] = field(default_factory=dict)
    encoder_images: int = 0
    similarity_words: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())

    def lines(self) -> list[str]:
        """The plan as console lines."""
        passes = sum(self.forward_rows.values()) + sum(self.backward_rows.values())
        backward = sum(self.backward_rows.values())
        lines = [
            f"faithfulness plan: {self.images} images, {self.words} words, {len(self.methods)} methods "
            f"({', '.join(self.methods)}); {passes:,} decoder rows ({backward:,} "
            f"with a backward pass)"
            + (f", {self.encoder_images:,} encoder images" if self.encoder_images else "")
        ]
        if self.seconds:
            parts = ", ".join(f"{part} {seconds:.0f} s" for part, seconds in self.seconds.items())
            lines.append(
                f"  expected time (estimate from a 1 s calibration on this machine): about "
                f"{_duration(self.total_seconds)} ({parts})"
            )
        return lines

    def to_json(self) -> dict:
        return {
            "images": self.images,
            "words": self.words,
            "methods": list(self.methods),
            "forward_rows": self.forward_rows,
            "backward_rows": self.backward_rows,
            "encoder_images": self.encoder_images,
            "similarity_words": self.similarity_words,
            "estimated_seconds": self.seconds,
        }


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def study_plan(
    decoder: CaptionDecoder,
    tokens: Sequence[Sequence[int]],
    cells: int,
    settings,
    image_pixels: int = 0,
) -> StudyPlan:
    """The passes of ``faithfulness_study`` (``settings``: its ``FaithfulnessSettings``) over captions
    ``tokens`` of images of ``cells`` grid cells (``image_pixels``: H W of the encoder's input, for the
    pixel curves)."""
    lengths = [len(caption) for caption in tokens]
    images, words = len(lengths), sum(lengths)
    methods = tuple(settings.methods)
    plan = StudyPlan(images, words, methods)

    def explaining(count: int, words_of: int) -> tuple[int, int]:
        forward = backward = 0
        for name in methods:
            steps = settings.ig_steps if name == "integrated_gradients" else 1
            backward += int(BACKWARD_PER_WORD.get(name, 1) * words_of * steps)
            forward += count * (cells + 1) if name == "occlusion" else count
        return forward, backward

    plan.forward_rows["explain"], plan.backward_rows["explain"] = explaining(images, words)
    orders = len(methods) + settings.random_seeds
    plan.forward_rows["curves"] = words * 2 * (settings.curve_steps + 1) * orders
    if settings.sanity_images:
        count = min(settings.sanity_images, images)
        # the trained maps, then each stage's: cascading, and with "both" each stage alone too
        variants = 2 if getattr(settings, "sanity_randomisation", "cascading") == "both" else 1
        stages = len(randomisation_stages(decoder)) * variants + 1
        forward, backward = explaining(count, sum(lengths[:count]))
        plan.forward_rows["sanity"], plan.backward_rows["sanity"] = forward * stages, backward * stages
        # every stage's maps (and the trained maps once, as the reference) through the four measures
        plan.similarity_words = sum(lengths[:count]) * len(methods) * stages
    if settings.pixel is not None and image_pixels:
        points = change_counts(image_pixels, settings.pixel.steps).numel()
        plan.forward_rows["pixel curves"] = words * 2 * points * orders
        plan.encoder_images = words * 2 * max(points - 2, 0) * orders + 2 * images + 1
    return plan


@torch.no_grad()
def _timed(function: Callable[[], object]) -> float:
    function()  # once to warm up (allocations, lazy initialisation)
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def calibrate(
    plan: StudyPlan,
    decoder: CaptionDecoder,
    annotations: Tensor,
    tokens: Sequence[Sequence[int]],
    batch_rows: int,
    encode: Callable[[Tensor], Tensor] | None = None,
    images: Tensor | None = None,
    similarity: tuple[tuple[int, int], int] | None = None,
) -> StudyPlan:
    """``plan`` with its seconds: each part's rows at the rates of one timed pass of ``batch_rows`` rows
    (the words of the first captions, repeated to fill it) forward, and forward and backward; the
    encoder images at the rate of one pass of ``images`` (a few of the study's); the randomisation
    tests' measures at the rate of comparing a few words' maps (``similarity``: the grid and the
    size in pixels they are compared at)."""
    count = min(len(tokens), 8)
    captions, lengths = caption_tensor(tokens[:count])
    scorer = WordScorer(decoder, captions.to(annotations.device), lengths.to(annotations.device))
    index = scorer.word_mask.nonzero()
    pick = torch.arange(batch_rows, device=index.device) % index.size(0)
    rows, words = index[pick, 0], index[pick, 1]
    grids = annotations[:count][rows].float()

    def forward() -> object:
        return scorer.words_at(grids, rows, words)

    def backward() -> object:
        with torch.enable_grad():
            grid = grids.clone().requires_grad_(True)
            return torch.autograd.grad(scorer.words_at(grid, rows, words).sum(), grid)

    forward_s, backward_s = _timed(forward) / batch_rows, _timed(backward) / batch_rows
    for part, rows_count in plan.forward_rows.items():
        plan.seconds[part] = rows_count * forward_s + plan.backward_rows.get(part, 0) * backward_s
    if plan.encoder_images and encode is not None and images is not None:
        per_image = _timed(lambda: encode(images)) / images.size(0)
        plan.seconds["pixel curves"] = plan.seconds.get("pixel curves", 0.0) + plan.encoder_images * per_image
    if plan.similarity_words and similarity is not None:
        plan.seconds["sanity"] = plan.seconds.get("sanity", 0.0) + plan.similarity_words * _similarity_rate(
            *similarity
        )
    return plan


def _similarity_rate(grid: tuple[int, int], size: int, words: int = 4) -> float:
    """Seconds to compare one word's maps by the four measures at ``size`` pixels (a timed comparison
    of ``words`` seeded random maps, its reference's HOG included)."""
    maps = torch.rand(2, words, grid[0] * grid[1], generator=torch.Generator().manual_seed(0))
    return _timed(lambda: Reference(maps[0], grid, size).compare(maps[1])) / words
