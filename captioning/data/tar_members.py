"""Images stored inside uncompressed tar files (WebDataset shards), named ``<shard>.tar#<member>``.

The webdataset reader (``captioning.data.shards``) names the image of each sample by its shard and
its member's name, ``shards/00000.tar#000000042.jpg``. ``load_image`` (``captioning.data.images``),
``stat_images`` and ``content_identity`` (``captioning.data.image_files``) read such a name as that
member's bytes, so the feature cache, training, evaluation and the figures read images from shards
as they read files.

Each member is read with one seek: a shard's members (their offsets and sizes) are listed once per
process, from its headers alone (``scan_shard``, which skips over the images' bytes, or the listing
kept on disk by ``captioning.data.shard_listings``); the reader lists every shard it reads and keeps
the lists (``remember``), and a process that did not (a spawned DataLoader worker, ``visualize.py``
reading a checkpoint's data) lists a shard on its first read from it. A shard whose size or
modification time changed is listed again. A real file is always read as the file, whatever its name.

What a shard says is bounded: a header whose size is negative or that does not lie after the one
before it ends the listing as a damaged shard (tarfile would read it again forever); a member's name
is a name inside its shard, never a path (``unsafe_name``: absolute, ``..`` or a NUL refused); each
member is read with the header before its bytes, which must be that member's (``read_member``).
"""

from __future__ import annotations

import os
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from captioning.utils.files import kind_of

MARK = "#"  # between the shard's path and the member's name
# The member suffixes that are images (as the webdataset reader takes them), the ones kept in the lists.
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
_BLOCK = tarfile.BLOCKSIZE


class MemberError(OSError):
    """A tar member cannot be read; the message says why, without the path (the caller names it)."""


@dataclass(frozen=True)
class Member:
    """One regular file of ``shard``: ``size`` bytes from ``offset``."""

    shard: Path
    name: str
    offset: int
    size: int


@dataclass
class ShardScan:
    """What a shard's headers say.

    Attributes:
        members: its regular files, in archive order, each complete (inside the file).
        truncated: None for a whole archive; else why it is not (the shard is cut short or damaged
            after the last member of ``members``): the member it ends in, or where the headers stop.
        cut: the name of the member the file ends in (its bytes are missing), or None.
    """

    members: list[Member] = field(default_factory=list)
    truncated: str | None = None
    cut: str | None = None


def member_path(shard: str | Path, name: str) -> Path:
    """The path-like name of member ``name`` of ``shard``: ``<shard>#<name>``."""
    return Path(f"{os.fspath(shard)}{MARK}{name}")


def split_member(path: str | Path) -> tuple[Path, str] | None:
    """``(shard, member name)`` of a ``<shard>.tar#<member>`` name, or None for any other path.

    A name holding ``.tar#`` more than once is split where the part before it is a file (the first
    such place; the first place when none is).
    """
    text = os.fspath(path)
    marker = ".tar" + MARK
    places = []
    start = text.find(marker)
    while start > 0:
        places.append(start + len(".tar"))
        start = text.find(marker, start + 1)
    if not places:
        return None
    cut = next((place for place in places if os.path.isfile(text[:place])), places[0])
    name = text[cut + len(MARK) :]
    return (Path(text[:cut]), name) if name else None


def scan_shard(shard: str | Path) -> ShardScan:
    """List the regular files of an uncompressed tar from its headers (the data in between is seeked
    over, never read).

    Raises:
        MemberError: the file is not a regular file, cannot be read, or is not an uncompressed tar
            archive (its first header).
    """
    scan = ShardScan()
    path = Path(shard)  # one for all of its members
    try:
        state = os.stat(shard)
        if not stat.S_ISREG(state.st_mode):  # opening a FIFO would wait forever
            raise MemberError(f"not a regular file ({kind_of(state.st_mode)})")
        size = state.st_size
        with open(shard, "rb") as handle:
            try:
                archive = tarfile.open(fileobj=handle, mode="r:")
            except tarfile.ReadError as error:
                what = (
                    "an empty file (0 bytes)" if size == 0 else f"not an uncompressed tar archive ({error})"
                )
                raise MemberError(what) from None
            last = None
            position = -1  # the offset of the last header read: every next one lies beyond it
            while True:
                try:
                    info = archive.next()
                except tarfile.ReadError as error:
                    after = f" after {last!r}" if last else ""
                    scan.truncated = f"the archive breaks off{after} ({error})"
                    break
                except (ValueError, OverflowError, EOFError) as error:  # a field tarfile cannot use
                    after = f" after {last!r}" if last else ""
                    scan.truncated = f"unreadable tar header at byte {archive.offset}{after} ({error})"
                    break
                if info is None:
                    break
                # the list tarfile keeps is not used here, and a shard has tens of thousands of members
                archive.members.clear()  # type: ignore[attr-defined]
                broken = _bad_header(info, position)
                if broken is not None:  # a negative size sends tarfile back to the same header forever
                    after = f" after {last!r}" if last else ""
                    scan.truncated = f"unreadable tar header at byte {info.offset}{after} ({broken})"
                    break
                position = info.offset
                if info.offset_data + info.size > size:
                    scan.truncated = (
                        f"{info.name!r} ends past the end of the file (at byte "
                        f"{info.offset_data + info.size} of {size})"
                    )
                    scan.cut = info.name
                    break
                last = info.name
                if info.isreg():
                    scan.members.append(Member(path, info.name, info.offset_data, info.size))
            if scan.truncated is None:  # tarfile stops quietly at a short or damaged header
                handle.seek(archive.offset)
                block = handle.read(_BLOCK)
                if block != bytes(_BLOCK):
                    after = f" after {last!r}" if last else ""
                    scan.truncated = (
                        f"the archive ends without its end-of-archive blocks{after}"
                        if len(block) < _BLOCK
                        else f"unreadable tar header at byte {archive.offset}{after}"
                    )
    except MemberError:
        raise
    except OSError as error:
        raise MemberError(f"cannot read the shard ({error.strerror or error})") from None
    return scan


def _bad_header(info: tarfile.TarInfo, previous: int) -> str | None:
    """What is wrong with a header's fields (each bounded by what a tar can hold), or None."""
    if info.size < 0:
        return f"member {info.name!r} has a negative size ({info.size})"
    if info.offset <= previous or info.offset_data <= info.offset:
        return f"member {info.name!r} does not lie after the header before it"
    return None


def unsafe_name(name: str) -> str | None:
    """Why a member's name cannot name an image inside its shard, or None: a member's name is a name
    inside the shard, never a path, so an absolute name, a ``..`` part or a NUL byte is refused."""
    if "\0" in name:
        return "its name holds a NUL byte"
    if name.startswith("/"):
        return "its name is absolute"
    if ".." in name.split("/"):
        return "its name climbs out of the shard ('..')"
    return None


@dataclass
class _Listing:
    size: int
    mtime_ns: int
    members: dict[str, tuple[int, int]]  # image member name -> (offset, size)


_LISTINGS: dict[str, _Listing] = {}  # absolute shard path -> its image members


def _is_image(name: str) -> bool:
    return name.rpartition(".")[2].lower() in IMAGE_EXTENSIONS


def remember(shard: str | Path, state: os.stat_result, scan: ShardScan) -> None:
    """Keep a shard's image members (as ``scan_shard`` listed them, the shard then ``state``) for this
    process's reads."""
    _LISTINGS[os.path.abspath(shard)] = _Listing(
        state.st_size,
        state.st_mtime_ns,
        {member.name: (member.offset, member.size) for member in scan.members if _is_image(member.name)},
    )


def forget_all() -> None:
    """Drop every kept listing (tests)."""
    _LISTINGS.clear()


def locate(path: str | Path) -> tuple[Member, os.stat_result] | None:
    """The member a ``<shard>.tar#<member>`` name names, with the shard's ``stat``; None when ``path``
    is not such a name or is a file of its own.

    Raises:
        MemberError: the shard is missing, not a regular file or not a tar, or holds no such member.
    """
    if MARK not in os.fspath(path) or os.path.lexists(path):
        return None
    parts = split_member(path)
    if parts is None:
        return None
    shard, name = parts
    unsafe = unsafe_name(name)
    if unsafe is not None:
        raise MemberError(f"member {name!r}: {unsafe}")
    try:
        state = os.stat(shard)
    except FileNotFoundError:
        raise MemberError(f"shard not found ({shard})") from None
    except OSError as error:
        raise MemberError(f"cannot read the shard ({error.strerror})") from None
    if not os.path.isfile(shard):
        raise MemberError(f"the shard {shard} is not a regular file")
    key = os.path.abspath(shard)
    listing = _LISTINGS.get(key)
    if listing is None or (listing.size, listing.mtime_ns) != (state.st_size, state.st_mtime_ns):
        remember(shard, state, scan_shard(shard))
        listing = _LISTINGS[key]
    found = listing.members.get(name)
    if found is None:
        raise MemberError(f"no image {name!r} in the shard")
    return Member(shard, name, *found), state


def _plain_name(name: str) -> bool:
    """Whether a tar header holds ``name`` whole (no PAX or GNU long-name header needed)."""
    return name.isascii() and len(name.encode()) <= 100


def _header_problem(member: Member, block: bytes) -> str | None:
    """Why the tar header just before ``member``'s bytes is not that member's, or None."""
    try:
        header = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
    except tarfile.HeaderError as error:
        return f"no tar header before its bytes ({error})"
    if not header.isreg() or header.size != member.size:
        return f"the header before its bytes is of {header.name!r} ({header.size} bytes)"
    if _plain_name(member.name) and header.name != member.name:
        return f"the header before its bytes names {header.name!r}"
    return None


def read_member(member: Member, handle: BinaryIO | None = None) -> bytes:
    """The bytes of ``member`` (one seek and one read), through ``handle`` (the shard open for
    reading) when given.

    The tar header just before the bytes is read with them and must be the member's (a regular file
    of its size, and of its name where the header holds the name whole): a listing that points a
    name at another member's bytes is refused, whoever wrote it.

    Raises:
        MemberError: the shard is shorter than the member's end, cannot be read, or holds another
            header before the member's bytes.
    """
    start = member.offset - _BLOCK
    if start < 0:
        raise MemberError(f"no tar header before its bytes (offset {member.offset})")
    try:
        if handle is not None:
            handle.seek(start)
            data = handle.read(_BLOCK + member.size)
        else:
            with open(member.shard, "rb") as opened:
                opened.seek(start)
                data = opened.read(_BLOCK + member.size)
    except OSError as error:
        raise MemberError(f"cannot read the shard ({error.strerror or error})") from None
    if len(data) != _BLOCK + member.size:
        got = max(0, len(data) - _BLOCK)
        raise MemberError(f"the shard ends inside this file ({got} of its {member.size} bytes)")
    problem = _header_problem(member, data[:_BLOCK])
    if problem is not None:
        _LISTINGS.pop(os.path.abspath(member.shard), None)  # this process lists the shard again
        raise MemberError(
            f"{problem}: the listing of the shard does not match it (edited?); remove its "
            "shard_listings folder to list it from its headers"
        )
    return data[_BLOCK:]


def member_stat(path: str | Path) -> os.stat_result | None:
    """The shard's ``stat`` with the member's size, for a ``<shard>.tar#<member>`` name; None for
    any other path.

    Raises:
        MemberError: as ``locate``.
    """
    found = locate(path)
    if found is None:
        return None
    member, state = found
    values = list(state)
    values[6] = member.size  # st_size; the times (st_mtime_ns, st_ctime_ns) stay the shard's
    times = ("st_atime", "st_mtime", "st_ctime", "st_atime_ns", "st_mtime_ns", "st_ctime_ns")
    return os.stat_result(values, {name: getattr(state, name) for name in times})


def image_exists(path: str | Path) -> bool:
    """Whether ``path`` is a regular file or an image member of a shard."""
    if os.path.isfile(path):
        return True
    try:
        return locate(path) is not None
    except MemberError:
        return False
