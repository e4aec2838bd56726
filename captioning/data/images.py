"""Image loading: any file PIL reads becomes an RGB image, or a one-line error naming it."""

from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path

from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

from captioning.data.records import DatasetError
from captioning.files import kind_of

# Keep PIL's decompression-bomb guard on (Image.MAX_IMAGE_PIXELS) and make truncated files errors.
ImageFile.LOAD_TRUNCATED_IMAGES = False


class ImageError(DatasetError):
    """An image file is missing or cannot be decoded."""


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
    where = f"{path}" + (f" ({entry})" if entry else "")
    try:  # only regular files: opening a FIFO or a device would wait forever or read without end
        kind = os.stat(path).st_mode
    except FileNotFoundError:
        raise ImageError(f"{where}: image file not found") from None
    except OSError as error:
        raise ImageError(f"{where}: cannot read ({error.strerror})") from None
    if stat.S_ISDIR(kind):
        raise ImageError(f"{where}: is a directory, not an image")
    if not stat.S_ISREG(kind):
        raise ImageError(f"{where}: not a regular file ({kind_of(kind)})")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                image.load()
                # Upright as a viewer shows it: phones store most photos rotated, with an EXIF orientation.
                return to_rgb(ImageOps.exif_transpose(image))
    except FileNotFoundError:
        raise ImageError(f"{where}: image file not found") from None
    except IsADirectoryError:
        raise ImageError(f"{where}: is a directory, not an image") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageError(f"{where}: image too large (over {Image.MAX_IMAGE_PIXELS} pixels)") from None
    except UnidentifiedImageError:
        what = "empty file (0 bytes)" if Path(path).stat().st_size == 0 else "not an image file PIL can read"
        raise ImageError(f"{where}: {what}") from None
    except (OSError, SyntaxError, ValueError) as error:
        raise ImageError(f"{where}: cannot decode image ({error})") from None


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
    if image.mode in ("RGBA", "LA", "PA"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")
