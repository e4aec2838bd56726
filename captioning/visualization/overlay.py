"""Attention maps onto image pixels: upsampling, display scaling, colour mapping and alpha blending.

The encoder resizes every image to a square without cropping, so the attention grid (gh, gw)
covers the whole image whatever its aspect ratio: cell (r, c) covers x in [c*W/gw, (c+1)*W/gw)
and y in [r*H/gh, (r+1)*H/gh) of a W x H image. Every map is therefore stretched onto exactly
(H, W); the upsampling factor follows the grid, so a 7x7 and a 14x14 grid both cover the image.
"""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import torch
import torch.nn.functional as F
import torchvision.transforms.functional as TF
from matplotlib.colors import Colormap
from torch import Tensor

MODES = ("bilinear", "gaussian")
# How the maps of one figure are scaled to colours: ``figure`` (0 to the largest weight of any word,
# one colour bar for all), ``absolute`` (0 to 1) or ``word`` (each map to its own peak, the old view).
NORMALIZATIONS = ("figure", "absolute", "word")
# Perceptually uniform: equal steps in weight look like equal steps in colour, unlike jet.
DEFAULT_CMAP = "viridis"
# Gaussian mode: blur at this many pixels per cell, then resize bilinearly to the image (the blurred
# map is smooth, so blurring at full resolution would only cost time).
_CELL_PIXELS = 8


def upsample_attention(
    attention: Tensor | np.ndarray,
    grid: tuple[int, int],
    size: tuple[int, int],
    mode: str = "bilinear",
    sigma_cells: float = 0.5,
    normalize: bool = True,
) -> np.ndarray:
    """Stretch T attention maps over an image of ``size`` pixels.

    Args:
        attention: (T, P) with P = gh * gw in row-major order, or (T, gh, gw); T may be 0.
        grid: (gh, gw), the attention grid.
        size: (H, W) of the image the maps are drawn on.
        mode: ``bilinear`` (``F.interpolate``, align_corners=False: each cell's value sits at the
            cell's centre) or ``gaussian`` (each cell a flat block, then a Gaussian blur of
            ``sigma_cells`` cell sizes, as in the paper's figures).
        sigma_cells: the Gaussian's standard deviation in cells (``gaussian`` only).
        normalize: scale each map by its own maximum to [0, 1] for display; a flat map stays flat
            (all ones) and an all-zero map stays zero.
    Returns:
        (T, H, W) float32 maps.
    Raises:
        ValueError: unknown mode, a shape that does not match the grid, or an empty size.
    """
    if mode not in MODES:
        raise ValueError(f"attention mode must be one of {', '.join(MODES)}, got {mode!r}")
    gh, gw = (int(v) for v in grid)
    height, width = (int(v) for v in size)
    if min(gh, gw, height, width) < 1:
        raise ValueError(f"grid {grid} and image size {size} must be positive")
    maps = torch.as_tensor(attention).detach().float().cpu()
    if maps.dim() == 2 and maps.size(1) == gh * gw:
        maps = maps.view(-1, gh, gw)  # (T, gh, gw)
    if maps.dim() != 3 or tuple(maps.shape[1:]) != (gh, gw):
        raise ValueError(
            f"attention of shape {tuple(maps.shape)} does not fit a {gh}x{gw} grid "
            f"(expected (T, {gh * gw}) or (T, {gh}, {gw}))"
        )
    if maps.size(0) == 0:
        return np.zeros((0, height, width), dtype=np.float32)
    maps = maps.unsqueeze(1)  # (T, 1, gh, gw)
    # antialias: an image smaller than the grid (or the blurred blocks) averages cells instead of
    # skipping them; enlarging is plain bilinear interpolation either way.
    if mode == "bilinear":
        upsampled = F.interpolate(
            maps, size=(height, width), mode="bilinear", align_corners=False, antialias=True
        )
    else:
        upsampled = F.interpolate(
            _blurred_blocks(maps, sigma_cells),
            size=(height, width),
            mode="bilinear",
            align_corners=False,
            antialias=True,
        )
    upsampled = upsampled.squeeze(1)  # (T, H, W)
    if normalize:
        peak = upsampled.amax(dim=(1, 2), keepdim=True)  # (T, 1, 1)
        upsampled = torch.where(peak > 1e-12, upsampled / peak.clamp_min(1e-12), torch.zeros_like(upsampled))
    return upsampled.numpy()


def _blurred_blocks(maps: Tensor, sigma_cells: float) -> Tensor:
    """(T, 1, gh, gw) -> (T, 1, gh*k, gw*k): each cell a k x k block, blurred by ``sigma_cells`` cells."""
    blocks = maps.repeat_interleave(_CELL_PIXELS, dim=2).repeat_interleave(_CELL_PIXELS, dim=3)
    sigma = max(sigma_cells, 1e-3) * _CELL_PIXELS
    kernel = 2 * math.ceil(3 * sigma) + 1
    # Reflect padding needs the half-kernel to be smaller than the map side.
    largest = 2 * min(blocks.shape[-2:]) - 1
    kernel = min(kernel, largest if largest % 2 else largest - 1)
    return TF.gaussian_blur(blocks, kernel_size=[kernel, kernel], sigma=[sigma, sigma])


def attention_statistics(attention: Tensor | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each word's peak weight and attention entropy, from the grid weights (not the upsampled maps).

    Args:
        attention: (T, P) or (T, gh, gw) weights; each row a distribution over the grid cells.
    Returns:
        ((T,) peak weights, (T,) entropies in nats). ``exp(entropy)`` is the effective number of
        cells attended: 1 for a one-hot map, P for a flat one. A row that sums to 0 has entropy 0.
    """
    weights = torch.as_tensor(attention).detach().double().cpu()
    if weights.numel() == 0:
        return np.zeros(len(weights)), np.zeros(len(weights))
    weights = weights.reshape(weights.size(0), -1)  # (T, P)
    total = weights.sum(dim=1, keepdim=True)  # (T, 1)
    shares = torch.where(total > 0, weights / total.clamp_min(1e-300), torch.zeros_like(weights))
    entropy = -torch.special.xlogy(shares, shares).sum(dim=1)  # (T,) 0 log 0 = 0
    return weights.amax(dim=1).numpy(), entropy.clamp_min(0.0).numpy() + 0.0  # + 0.0: no "-0.00"


# A flat map must look flat: a colour scale's top is at least this many times the value a map's cells
# would have if its (positive) total were spread evenly over the grid. A uniform map of attention over
# 49 cells (0.02 each) is then drawn at a quarter of the scale, not at its top; a sharp map's peak is far
# above the floor (above 4/P) and sets the top itself.
FLAT_FLOOR = 4.0


def scale_top(maps: Tensor | np.ndarray) -> float:
    """The top of a colour scale that starts at 0 for (T, P) or (T, gh, gw) ``maps`` (their positive
    part): the largest value, or ``FLAT_FLOOR`` times the largest even spread (a word's positive total
    over P cells) when that is higher; 1 when every value is 0 or below."""
    values = np.clip(np.asarray(torch.as_tensor(maps).detach().double().cpu()), 0.0, None)
    if values.size == 0:
        return 1.0
    values = values.reshape(values.shape[0], -1)  # (T, P)
    floor = FLAT_FLOOR * float(values.sum(axis=1).max()) / values.shape[1]
    top = max(float(values.max()), floor)
    return top if top > 1e-12 else 1.0


def display_range(attention: Tensor | np.ndarray, normalize: str = "figure") -> list[tuple[float, float]]:
    """The (vmin, vmax) that colours each word's map under ``normalize`` (see ``NORMALIZATIONS``).

    Args:
        attention: (T, P) or (T, gh, gw) grid weights.
        normalize: ``figure`` (0 to the largest weight of all T maps, at least ``FLAT_FLOOR`` / P so
            that a flat map is drawn dark: ``scale_top``), ``absolute`` (0 to 1) or ``word`` (0 to
            each map's own peak, which draws a flat map as bright as a sharp one).
    Returns:
        T pairs; the top is never 0 (an all-zero map is drawn at the bottom of the scale).
    Raises:
        ValueError: unknown ``normalize``.
    """
    if normalize not in NORMALIZATIONS:
        raise ValueError(f"normalize must be one of {', '.join(NORMALIZATIONS)}, got {normalize!r}")
    peaks, _ = attention_statistics(attention)
    if normalize == "absolute":
        tops = np.ones_like(peaks)
    elif normalize == "figure":
        tops = np.full_like(peaks, scale_top(attention) if len(peaks) else 1.0)
    else:
        tops = peaks
    return [(0.0, float(top) if top > 1e-12 else 1.0) for top in tops]


def colour_map(name: str) -> Colormap:
    """The matplotlib colour map called ``name``.

    Raises:
        ValueError: no such colour map.
    """
    try:
        return matplotlib.colormaps[name]
    except KeyError:
        raise ValueError(f"unknown colour map {name!r}") from None


def colorize(heat: np.ndarray, cmap: str = DEFAULT_CMAP, alpha: float = 0.6) -> np.ndarray:
    """Colour one display-scaled map with a matplotlib colour map.

    Args:
        heat: (H, W) values in [0, 1].
        cmap: a matplotlib colour map name.
        alpha: the overlay's opacity, the same everywhere (as in the paper's figures).
    Returns:
        (H, W, 4) uint8 RGBA, ready to be placed over the image.
    """
    colours = colour_map(cmap)
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    rgba = colours(np.clip(heat, 0.0, 1.0), bytes=True)  # (H, W, 4) uint8
    rgba[..., 3] = round(alpha * 255)
    return rgba


def blend(image: np.ndarray, heat: np.ndarray, cmap: str = DEFAULT_CMAP, alpha: float = 0.6) -> np.ndarray:
    """Alpha-blend a coloured map over an image.

    Args:
        image: (H, W, 3) uint8 RGB.
        heat: (H, W) display-scaled map in [0, 1], aligned with ``image``.
    Returns:
        (H, W, 3) uint8 RGB: ``(1 - alpha) * image + alpha * cmap(heat)``.
    """
    if image.shape[:2] != heat.shape:
        raise ValueError(f"image {image.shape[:2]} and map {heat.shape} differ in size")
    colour = colorize(heat, cmap, alpha)[..., :3].astype(np.float32)
    mixed = (1.0 - alpha) * image.astype(np.float32) + alpha * colour
    return np.clip(np.rint(mixed), 0, 255).astype(np.uint8)


def display_size(size: tuple[int, int], max_side: int | None) -> tuple[int, int]:
    """(W, H) scaled down (never up) so the longer side is at most ``max_side``; None keeps it."""
    width, height = size
    if not max_side or max(width, height) <= max_side:
        return width, height
    scale = max_side / max(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))
