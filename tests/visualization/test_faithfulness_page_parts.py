"""The faithfulness page's figures outline the objects a word names on each method's maps, and say so."""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path

import numpy as np
from PIL import Image

from captioning.visualization.faithfulness_page import ExplainedImage, write_faithfulness_page


def red_pixels(page: str) -> int:
    """Pixels of the page's first figure close to the boxes' red (#ff4d4d)."""
    figure = re.search(r'src="data:image/jpeg;base64,([^"]+)"', page).group(1)
    pixels = np.asarray(Image.open(io.BytesIO(base64.b64decode(figure))).convert("RGB")).astype(int)
    return int(((pixels[..., 0] > 200) & (pixels[..., 1] < 120) & (pixels[..., 2] < 120)).sum())


def test_each_methods_maps_outline_the_named_objects(tmp_path: Path):
    words = ["a", "circle"]
    maps = {"attention": np.zeros((2, 4)), "occlusion": np.zeros((2, 4))}
    picture = Image.new("RGB", (64, 64), "white")
    pages = {}
    for name, boxes in (("boxed", [[], [(8.0, 8.0, 30.0, 30.0)]]), ("plain", [])):
        item = ExplainedImage(7, "7.png", words, maps, {}, boxes)
        path = write_faithfulness_page(
            tmp_path / f"{name}.html", {}, [item], [picture], (2, 2), progress=False
        )
        pages[name] = path.read_text(encoding="utf-8")
    assert "Dashed red boxes: the annotated objects that circle names" in pages["boxed"]
    assert "Dashed red boxes" not in pages["plain"]
    assert red_pixels(pages["plain"]) == 0
    assert red_pixels(pages["boxed"]) > 20  # the dashed outline on the circle's panel of both rows
