"""WebDataset shards in the exact layout img2dataset writes (its ``webdataset`` output format).

In the output folder, per shard: ``00000.tar`` (written with webdataset's ``TarWriter``, as img2dataset
writes it: per sample ``<key>.jpg``, ``<key>.json`` with the sample's metadata, ``<key>.txt`` with the
caption, in that order), ``00000.parquet`` (the shard's metadata table; here a placeholder) and
``00000_stats.json``. Keys are the shard's number (5 digits) then the sample's (4 digits).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

from PIL import Image

COLOURS = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (200, 200, 30), (30, 200, 200), (200, 30, 200)]
NAMES = ["red", "green", "blue", "yellow", "cyan", "purple"]


def jpeg(colour: tuple[int, int, int], size: tuple[int, int] = (48, 40)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, "JPEG")
    return buffer.getvalue()


def default_caption(number: int) -> str:
    return f"A {NAMES[number % 6]} picture."


def write_img2dataset(
    folder: Path,
    shards: int = 3,
    per_shard: int = 8,
    caption: Callable[[int], str | None] = default_caption,
    edit: Callable[[int, dict], None] | None = None,
) -> list[Path]:
    """Write ``shards`` shards of ``per_shard`` samples each under ``folder``; sample ``n`` (counted
    across shards) is a JPEG of ``COLOURS[n % 6]`` captioned ``caption(n)``. ``edit(n, sample)`` may
    change the sample (its ``__key__``, ``jpg``, ``txt``, ``json``) before it is written.

    Returns:
        The tar files, in order.
    """
    import webdataset

    folder.mkdir(parents=True, exist_ok=True)
    tars = []
    for shard in range(shards):
        tar = folder / f"{shard:05d}.tar"
        rows = []
        with webdataset.TarWriter(str(tar)) as writer:
            for position in range(per_shard):
                number = shard * per_shard + position
                key = f"{shard:05d}{position:04d}"
                text = caption(number)
                meta = {
                    "url": f"https://example.com/{key}.jpg",
                    "caption": text,
                    "key": key,
                    "status": "success",
                    "error_message": None,
                    "width": 48,
                    "height": 40,
                    "original_width": 480,
                    "original_height": 400,
                    "exif": None,
                    "sha256": "0" * 64,
                }
                sample = {
                    "__key__": key,
                    "jpg": jpeg(COLOURS[number % 6]),
                    "json": json.dumps(meta, indent=4),
                }
                if text is not None:
                    sample["txt"] = text
                if edit is not None:
                    edit(number, sample)
                writer.write(sample)
                rows.append(meta)
        (folder / f"{shard:05d}.parquet").write_bytes(b"PAR1" + json.dumps(rows).encode() + b"PAR1")
        stats = {"count": per_shard, "successes": per_shard, "failed_to_download": 0, "status_dict": {}}
        (folder / f"{shard:05d}_stats.json").write_text(json.dumps(stats, indent=4), encoding="utf-8")
        tars.append(tar)
    return tars
