"""Reader for a plain folder of images (captioning new images, no references)."""

from __future__ import annotations

from pathlib import Path

from captioning.config import DataConfig
from captioning.data.readers import DatasetReader, check_data_paths, register_reader
from captioning.data.records import DatasetError, ImageRecord

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp"})


def read_folder(folder: str | Path) -> list[ImageRecord]:
    """One record per image file directly inside ``folder`` (not in sub-folders).

    Files are those with an image suffix (``IMAGE_SUFFIXES``, any case), hidden files and
    sub-folders excluded, sorted by file name. Anything else with such a name (a FIFO, a socket, a
    broken link) is kept, so that reading it fails naming it, or it is skipped and counted with
    ``data.skip_bad_images``, like an image that cannot be decoded: never silently dropped.
    ``image_id`` is the 1-based position in that order, so ids are stable as long as the folder's
    file names are; ``split`` is ``""`` and there are no captions.

    Raises:
        DatasetError: the folder does not exist, is not a folder, or holds no image file.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise DatasetError(f"{folder}: " + ("not a folder" if folder.exists() else "folder not found"))
    paths = sorted(
        (
            p
            for p in folder.iterdir()
            if p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith(".") and not p.is_dir()
        ),
        key=lambda p: p.name,
    )
    if not paths:
        raise DatasetError(f"{folder}: no image files ({', '.join(sorted(IMAGE_SUFFIXES))})")
    return [ImageRecord(image_id=number, path=path, split="") for number, path in enumerate(paths, start=1)]


@register_reader("folder")
class FolderReader(DatasetReader):
    """The images directly inside ``data.root``, to caption: no splits, no captions."""

    captioned = False

    def read(self, config: DataConfig) -> list[ImageRecord]:
        check_data_paths(config)
        return read_folder(config.root)

    def cache_under_root(self, config: DataConfig) -> bool:
        """A folder of photos to caption is not written into: its features go under the run folder."""
        return False
