"""Image loading: any file PIL reads becomes an RGB image, or a one-line error naming it."""

from __future__ import annotations

import io
import os
import stat
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

from captioning.data import tar_members
from captioning.data.records import DatasetError
from captioning.utils.files import kind_of

if TYPE_CHECKING:
    import numpy as np

# Keep PIL's decompression-bomb guard on (Image.MAX_IMAGE_PIXELS) and make truncated files errors.
ImageFile.LOAD_TRUNCATED_IMAGES = False


class ImageError(DatasetError):
    """An image file is missing or cannot be decoded."""


# What an image may cost, checked from its header before any pixel is decoded (and for pictures
# given in memory, before they are resized). Pillow's own guard (Image.MAX_IMAGE_PIXELS, ~89M
# pixels) lets a 1 x 80,000,000 one-bit PNG of 155 KB through, whose resize to the encoder's size
# then needs tens of GB; no camera or scanner makes such shapes.
MAX_IMAGE_SIDE = 30_000  # pixels on either side (a 30,000 x 3,000 panorama passes)
# longer side over shorter side, for images over 2,000 pixels long (360-degree panoramas are 2:1 to 10:1)
MAX_ASPECT_RATIO = 50.0
MAX_DECODED_BYTES = 1 << 30  # the decoded pixels in the file's own mode, before conversion to RGB

_BYTES_PER_PIXEL = {"1": 1 / 8, "L": 1, "P": 1, "LA": 2, "PA": 2, "La": 2, "I;16": 2, "I;16B": 2, "I;16L": 2}


def check_image_cost(size: tuple[int, int], mode: str, where: str) -> None:
    """Refuse an image whose shape or decoded size no photograph has (``ImageError`` naming ``where``).

    Args:
        size: (width, height) in pixels, as the file's header gives it.
        mode: the PIL mode of the decoded pixels (their bytes per pixel).
        where: the file or entry, for the message.
    """
    width, height = size
    if width < 1 or height < 1:
        raise ImageError(f"{where}: an image needs a size of at least 1x1, got {width}x{height}")
    if max(width, height) > MAX_IMAGE_SIDE:
        raise ImageError(
            f"{where}: image too large ({width}x{height} pixels; each side may be at most {MAX_IMAGE_SIDE})"
        )
    if max(width, height) > 2000 and max(width, height) / min(width, height) > MAX_ASPECT_RATIO:
        raise ImageError(
            f"{where}: image shape refused ({width}x{height} pixels, an aspect ratio over "
            f"{MAX_ASPECT_RATIO:g}:1 that no camera makes)"
        )
    decoded = width * height * _BYTES_PER_PIXEL.get(mode, len(mode) if mode.isalpha() else 4)
    if decoded > MAX_DECODED_BYTES:
        raise ImageError(
            f"{where}: image too large ({width}x{height} pixels in mode {mode} decode to "
            f"{decoded / (1 << 20):.0f} MiB; at most {MAX_DECODED_BYTES >> 20} MiB)"
        )


def load_image(path: str | Path, entry: str | None = None) -> Image.Image:
    """Open an image, turn it upright (its EXIF orientation) and convert it to 8-bit RGB.

    Grayscale, 16-bit, CMYK, palette and RGBA images are converted (alpha is composited on
    white). Truncated, empty, non-image and over-large files raise ``ImageError``.

    Args:
        path: the image file.
        entry: what refers to the image (e.g. ``"dataset_coco.json: image 391895"``), for the message.
    Returns:
        A fully decoded ``PIL.Image.Image`` in mode ``RGB``.
    """
    with _opened(path, entry) as image:
        image.load()
        # Upright as a viewer shows it: phones store most photos rotated, with an EXIF orientation.
        return to_rgb(ImageOps.exif_transpose(image))


def check_image_file(path: str | Path, entry: str | None = None) -> None:
    """What ``load_image`` checks before it decodes a pixel: a regular file PIL identifies, whose
    header's size and mode pass ``check_image_cost`` (``ImageError`` otherwise). A file that is
    truncated after its header passes: only decoding it finds that."""
    with _opened(path, entry):
        pass


@contextmanager
def _opened(path: str | Path, entry: str | None) -> Iterator[Image.Image]:
    """The image file opened (header read, its cost checked, no pixel decoded); every error while it
    is open, decoding included, becomes one ``ImageError`` naming the file and ``entry``."""
    where = f"{path}" + (f" ({entry})" if entry else "")
    source: str | Path | io.BytesIO = path
    try:  # only regular files: opening a FIFO or a device would wait forever or read without end
        state = os.stat(path)
    except FileNotFoundError:
        source = _member_bytes(path, where)  # a shard's member, <shard>.tar#<name> (tar_members)
        size = len(source.getbuffer())
    except OSError as error:
        raise ImageError(f"{where}: cannot read ({error.strerror})") from None
    else:
        if stat.S_ISDIR(state.st_mode):
            raise ImageError(f"{where}: is a directory, not an image")
        if not stat.S_ISREG(state.st_mode):
            raise ImageError(f"{where}: not a regular file ({kind_of(state.st_mode)})")
        size = state.st_size
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(source) as image:
                check_image_cost(image.size, image.mode, where)  # from the header, before decoding
                yield image
    except ImageError:
        raise
    except FileNotFoundError:
        raise ImageError(f"{where}: image file not found") from None
    except IsADirectoryError:
        raise ImageError(f"{where}: is a directory, not an image") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageError(f"{where}: image too large (over {Image.MAX_IMAGE_PIXELS} pixels)") from None
    except UnidentifiedImageError:
        what = "empty file (0 bytes)" if size == 0 else "not an image file PIL can read"
        raise ImageError(f"{where}: {what}") from None
    except (OSError, SyntaxError, ValueError) as error:
        raise ImageError(f"{where}: cannot decode image ({error})") from None


def _member_bytes(path: str | Path, where: str) -> io.BytesIO:
    """The bytes of the shard member ``path`` names (``<shard>.tar#<name>``), or ``ImageError``
    naming ``where``: "image file not found" for a path that is neither a file nor such a name."""
    try:
        found = tar_members.locate(path)
        if found is None:
            raise ImageError(f"{where}: image file not found")
        member, _ = found
        return io.BytesIO(tar_members.read_member(member))
    except tar_members.MemberError as error:
        raise ImageError(f"{where}: {error}") from None


def to_rgb(image: Image.Image) -> Image.Image:
    """Convert any PIL mode to 8-bit RGB (16-bit grayscale is scaled, alpha composited on white).

    Integer grayscale (modes ``I;16``, ``I;16B``, ``I;16L`` and ``I``) is read as 16-bit data and
    scaled by the format's full range, not by each image's own minimum and maximum: 0 becomes 0,
    65535 becomes 255, and ``v`` becomes ``round(v * 255 / 65535)`` (i.e. ``v / 257``, halves
    rounded up), so a white image stays white and a dark one stays dark. Pillow opens 16-bit
    grayscale PNGs as ``I;16`` (older versions as ``I``); mode ``I`` is 32-bit signed, and its
    values are taken as 16-bit too: values below 0 are clipped to 0 (black) and values above 65535
    to 255 (white). Palette and alpha images are composited on white; other modes (``1``, ``L``,
    ``CMYK``, ``F``, ...) go through Pillow's ``convert``.
    """
    if image.mode == "RGB":
        return image.copy()
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        import numpy as np

        values = np.clip(np.asarray(image).astype(np.int64), 0, 65535)
        scaled = (values * 255 + 65535 // 2) // 65535  # round(v * 255 / 65535), halves up
        return Image.fromarray(scaled.astype(np.uint8)).convert("RGB")  # 2-D uint8: mode L
    if image.mode == "P":
        image = image.convert("RGBA")
    if image.mode == "La":  # luminance with premultiplied alpha: un-premultiply first
        image = image.convert("LA")
    if image.mode == "RGBa":
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def as_rgb_image(value: object, entry: str) -> Image.Image:
    """Any picture the Python API takes, as a fully decoded 8-bit RGB image.

    Args:
        value: a path (``str`` or ``Path``, read with ``load_image``), a ``PIL.Image.Image`` (any
            mode, see ``to_rgb``), a tensor (C, H, W) or a NumPy array (H, W, C) or (H, W), with C
            1 (gray), 3 (RGB) or 4 (RGBA, composited on white); uint8 values in [0, 255] or
            floating-point values in [0, 1] (rounded to the nearest of 256 levels).
        entry: what the value is, for messages (``images[2]``).
    Raises:
        ImageError: an unreadable file, a wrong shape or type, or values out of range (one line
            naming ``entry``).
    """
    import numpy as np

    if isinstance(value, (str, Path)):
        return load_image(value, entry)
    if isinstance(value, Image.Image):
        check_image_cost(value.size, value.mode, entry)
        try:
            value.load()
        except (OSError, ValueError) as error:
            raise ImageError(f"{entry}: cannot decode image ({error})") from None
        return to_rgb(value)
    pixels = _checked_pixels(value, entry)  # (H, W, C)
    data = pixels if pixels.dtype == np.uint8 else np.rint(pixels.astype(np.float64) * 255).astype(np.uint8)
    mode = {1: "L", 3: "RGB", 4: "RGBA"}[data.shape[2]]
    return to_rgb(Image.fromarray(np.ascontiguousarray(data if mode != "L" else data[:, :, 0]), mode))


def check_picture(value: object, entry: str) -> None:
    """What ``as_rgb_image`` checks before it decodes a pixel or converts one, keeping nothing: a
    path's file and header (``check_image_file``), a PIL image's size and mode, a tensor's or an
    array's type, shape, size and values. Only what decoding finds (a file truncated after its
    header) is left to ``as_rgb_image``.

    Raises:
        ImageError: one line naming ``entry``, as ``as_rgb_image`` would.
    """
    if isinstance(value, (str, Path)):
        check_image_file(value, entry)
    elif isinstance(value, Image.Image):
        check_image_cost(value.size, value.mode, entry)
    else:
        _checked_pixels(value, entry)


def _checked_pixels(value: Any, entry: str) -> np.ndarray:
    """A tensor's or an array's pixels as an (H, W, C) array, uint8 or floating point in [0, 1],
    after every check ``as_rgb_image`` applies to them (a CPU tensor's pixels are a view of it)."""
    import numpy as np

    torch = sys.modules.get("torch")  # a tensor exists only once torch is imported: not imported here
    if torch is not None and isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.is_meta:
            where = "on the meta device" if value.is_meta else f"with layout {value.layout}"
            raise ImageError(f"{entry}: a tensor image needs dense values, got a tensor {where}")
        if value.dim() != 3:
            raise ImageError(f"{entry}: a tensor image must be (C, H, W), got shape {tuple(value.shape)}")
        if value.is_floating_point() and value.dtype not in (torch.float32, torch.float64):
            value = value.float()  # bfloat16, float16 and float8 have no NumPy form
        value = value.detach().cpu().permute(1, 2, 0).numpy()  # (H, W, C)
        layout = "a (C, H, W) tensor"
    elif isinstance(value, np.ndarray):
        layout = "an (H, W, C) array"
    else:
        raise ImageError(
            f"{entry}: expected an image path, a PIL image, a (C, H, W) tensor or an (H, W, C) "
            f"array, got {type(value).__name__}"
        )
    pixels = value[:, :, None] if value.ndim == 2 else value  # (H, W, C)
    if pixels.ndim != 3 or pixels.shape[2] not in (1, 3, 4) or min(pixels.shape[:2]) < 1:
        raise ImageError(
            f"{entry}: as {layout}, an image needs 1, 3 or 4 channels and a size of at least 1x1, "
            f"got shape {tuple(value.shape)}"
        )
    check_image_cost((pixels.shape[1], pixels.shape[0]), "RGBA", entry)  # before it is resized
    if np.issubdtype(pixels.dtype, np.floating):
        if not np.isfinite(pixels).all() or pixels.min() < 0 or pixels.max() > 1:
            raise ImageError(
                f"{entry}: floating-point pixels must be finite and in [0, 1], got values in "
                f"[{np.nanmin(pixels):.3g}, {np.nanmax(pixels):.3g}]"
            )
    elif pixels.dtype != np.uint8:
        raise ImageError(f"{entry}: pixels must be uint8 (0-255) or floating point (0-1), got {pixels.dtype}")
    return pixels
