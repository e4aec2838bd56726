"""Image files before any work: one ``stat`` per file, and a content identity that survives a move.

``stat_images`` runs before a feature cache reserves its disk space, so a mistyped ``data.root``
fails in seconds naming the first missing file instead of after reserving tens of GiB.
``content_identity`` names a file's bytes (size plus a hash of its first and last 64 KiB), so
features keyed by it survive moving the data, copying it without its times, or reading the same
images through another annotation file.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from captioning.data import tar_members
from captioning.data.images import ImageError
from captioning.data.records import ImageRecord
from captioning.utils.files import kind_of

HASH_SPAN = 64 * 1024  # bytes hashed at each end of a file


def stat_images(
    records: list[ImageRecord], allow_missing: bool = False
) -> tuple[list[os.stat_result | None], dict[int, str]]:
    """``os.stat`` of every record's image, refusing missing files and anything but regular files.

    Args:
        records: the images.
        allow_missing: give None for a missing or non-regular file instead of refusing it
            (``data.skip_bad_images``); refused all the same when no image exists at all.
    Returns:
        One ``stat_result`` (or None) per record, in order, and position -> one-line message of
        each file that is not there.
    Raises:
        ImageError: one line naming the first bad file and its entry, and how many more there are.
    """
    states: list[os.stat_result | None] = []
    problems: dict[int, str] = {}
    for position, record in enumerate(records):
        what = None
        state: os.stat_result | None
        try:
            state = os.stat(record.path)
        except FileNotFoundError:
            try:  # a shard's member, <shard>.tar#<name>: the shard's stat with the member's size
                state = tar_members.member_stat(record.path)
            except tar_members.MemberError as error:
                what = str(error)
            else:
                what = "image file not found" if state is None else None
        except OSError as error:
            what = f"cannot stat the image file ({error.strerror})"
        else:
            if stat.S_ISDIR(state.st_mode):
                what = "is a directory, not an image"
            elif not stat.S_ISREG(state.st_mode):
                what = f"not a regular file ({kind_of(state.st_mode)})"
        if what is not None:
            problems[position] = f"{record.path} (image {record.image_id}): {what}"
            state = None
        states.append(state)
    if problems and (not allow_missing or len(problems) == len(records)):
        more = (
            (
                f" (and {len(problems) - 1} more of the {len(records)} images are missing or not files; "
                "is data.root right?)"
            )
            if len(problems) > 1
            else ""
        )
        raise ImageError(next(iter(problems.values())) + more)
    return states, problems


def content_identity(path: str | Path, size: int) -> str:
    """``"<size>:<blake2b of the size, the first and the last 64 KiB>"`` of a file of ``size`` bytes.

    Reads at most 128 KiB whatever the file's size. An edit that keeps the size and touches only
    the middle of a file larger than 128 KiB goes unnoticed; image encoders rewrite headers and
    tails, so in practice a changed image changes its identity.
    """
    digest = hashlib.blake2b(digest_size=16)
    digest.update(size.to_bytes(8, "little"))
    found = tar_members.locate(path)
    if found is not None:  # a shard's member: the identity its bytes would have as a file
        data = tar_members.read_member(found[0])
        digest.update(data[:HASH_SPAN])
        if size > HASH_SPAN:
            digest.update(data[max(HASH_SPAN, size - HASH_SPAN) :])
        return f"{size}:{digest.hexdigest()}"
    with open(path, "rb") as handle:
        digest.update(handle.read(HASH_SPAN))
        if size > HASH_SPAN:
            handle.seek(max(HASH_SPAN, size - HASH_SPAN))
            digest.update(handle.read(HASH_SPAN))
    return f"{size}:{digest.hexdigest()}"
