"""Each shard's listing (its members' names, offsets and sizes, as its tar headers give them) kept on
disk, so that a start after the first reads no tar headers.

Listing a shard reads every header through the whole tar: two per member in webdataset's and
img2dataset's files (a PAX header, then the member's), 60,000 for a shard of 20,000 files. A
training or caching run (``load_records`` with ``write_index``: rank 0 of a ``torchrun`` job) writes
each listing it made under ``<data.cache_dir>/shard_listings/`` (by default
``<folder of the shards>/features/shard_listings/``), one file per shard::

    00000-<hash of the shard's absolute path>.json

It holds the shard's absolute path, its size, modification and change times, inode and device when
it was listed, what ``tar_members.scan_shard`` found, and a hash of all of that keyed by the user's
own key (``key_file``: made on first use, readable by the user alone), so that a listing edited and
hashed again by anyone without the key does not hold. A later start (any tool, any rank) uses a
listing only when the shard's path and ``stat`` are the ones it records and the keyed hash holds;
anything else (the shard touched, rewritten or replaced, a damaged, truncated or edited listing, one
another user wrote) is listed from the headers again, never trusted, and rewritten when the run may
write. Each member's bytes are read with the tar header before them, which must be that member's
(``tar_members.read_member``). Every file is written atomically under the cache folder, never
through a link (``captioning.utils.files.atomic_write`` with ``under``). Tools that take their
configuration from a checkpoint only read listings, never write them.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from captioning.data import tar_members
from captioning.data.tar_members import Member, ShardScan
from captioning.utils.files import atomic_write, not_a_regular_file
from captioning.utils.json_files import read_json_file

FORMAT_VERSION = 2
FOLDER = "shard_listings"
KEY_NAME = "listings.key"
_FIELDS = {"format", "shard", "stat", "members", "truncated", "cut", "digest"}

logger = logging.getLogger(__name__)


def listing_path(folder: Path, shard: str | Path) -> Path:
    """The file of ``shard``'s listing in ``folder``: its name then a hash of its absolute path."""
    absolute = os.path.abspath(shard)
    return folder / f"{Path(absolute).stem}-{hashlib.sha256(absolute.encode()).hexdigest()[:16]}.json"


def _stamp(state: os.stat_result) -> list[int]:
    return [state.st_size, state.st_mtime_ns, state.st_ctime_ns, state.st_ino, state.st_dev]


def key_file() -> Path:
    """The user's key that signs listings: ``$XDG_CACHE_HOME/captioning/listings.key`` (by default
    under ``~/.cache``), 32 random bytes readable by the user alone, made on first use."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "captioning" / KEY_NAME


def _key() -> bytes | None:
    """This user's listing key (made when missing); None when it can be neither read nor made."""
    path = key_file()
    for _ in range(2):
        try:
            descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            except FileExistsError:
                continue  # another process made it first: read that one
            except OSError:
                return None
            try:
                key = secrets.token_bytes(32)
                os.write(descriptor, key)
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
            return key
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                return None
            key = os.read(descriptor, 64)
        finally:
            os.close(descriptor)
        return key if len(key) == 32 else None
    return None


def _digest(payload: dict[str, Any], key: bytes) -> str:
    """A hash keyed by the user's key: a listing edited by anyone without it does not hold."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16, key=key).hexdigest()


def _payload(shard: str | Path, state: os.stat_result, scan: ShardScan) -> dict[str, Any]:
    return {
        "format": FORMAT_VERSION,
        "shard": os.path.abspath(shard),
        "stat": _stamp(state),
        "members": [[member.name, member.offset, member.size] for member in scan.members],
        "truncated": scan.truncated,
        "cut": scan.cut,
    }


def _scan_of(payload: Any, shard: str | Path, state: os.stat_result) -> ShardScan | None:
    """The scan a listing file's content records, when it is this shard's as it is now and intact."""
    if not isinstance(payload, dict) or set(payload) != _FIELDS:
        return None
    recorded = payload.pop("digest")
    key = _key()
    if (
        key is None
        or payload["format"] != FORMAT_VERSION
        or payload["shard"] != os.path.abspath(shard)
        or payload["stat"] != _stamp(state)
        or not isinstance(recorded, str)
        or not hmac.compare_digest(recorded, _digest(payload, key))
    ):
        return None
    if not isinstance(payload["members"], list) or any(
        payload[optional] is not None and not isinstance(payload[optional], str)
        for optional in ("truncated", "cut")
    ):
        return None
    path, size, end = Path(shard), state.st_size, 0
    members = []
    for entry in payload["members"]:  # each [name, offset, size], in archive order inside the file
        if not (
            isinstance(entry, list)
            and len(entry) == 3
            and isinstance(entry[0], str)
            and all(type(number) is int for number in entry[1:])
            and entry[1] >= end
            and entry[1] + entry[2] <= size
            and entry[2] >= 0
        ):
            return None
        end = entry[1] + entry[2]
        members.append(Member(path, entry[0], entry[1], entry[2]))
    return ShardScan(members, payload["truncated"], payload["cut"])


def read_listing(folder: Path, shard: str | Path, state: os.stat_result) -> ShardScan | None:
    """The listing of ``shard`` (``stat`` ``state``) kept in ``folder``; None when there is none, or it
    is another shard's, another state's, or damaged."""
    path = listing_path(folder, shard)
    if not_a_regular_file(path) is not None:
        return None
    try:
        payload = read_json_file(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:  # unreadable, not UTF-8, not JSON
        logger.info("%s: unreadable shard listing (%s); listing %s again", path, error, shard)
        return None
    return _scan_of(payload, shard, state)


def write_listing(
    folder: Path, shard: str | Path, state: os.stat_result, scan: ShardScan, under: Path | None = None
) -> None:
    """Keep ``scan``, the listing of ``shard`` made when it was ``state``, in ``folder``, never through a
    link or into anything but a regular file below ``under`` (by default ``folder``'s parent).

    Raises:
        OSError, ValueError: the folder cannot be written (``atomic_write``'s one-line errors).
    """
    key = _key()
    if key is None:
        raise OSError(f"cannot read or make the listings key {key_file()}")
    payload = _payload(shard, state, scan)
    text = json.dumps({**payload, "digest": _digest(payload, key)}, separators=(",", ":"))
    atomic_write(
        listing_path(folder, shard),
        lambda path: path.write_text(text, encoding="utf-8"),
        under=folder.parent if under is None else under,
    )


class Listings:
    """The listings of one reading of shards: kept ones used, others made from the headers and kept.

    Args:
        folder: where listings are kept; None: every shard is listed from its headers.
        writable: keep the listings made (a training or caching run's rank 0).
        under: the folder the user named that holds ``folder`` (``data.cache_dir``, else the shards'
            folder): nothing below it is written through a link (by default ``folder``'s parent).
    """

    def __init__(self, folder: Path | None, writable: bool, under: Path | None = None) -> None:
        self.folder, self.writable = folder, writable and folder is not None
        self.under = under
        self._unwritable: str | None = None  # why the first listing could not be kept

    def scan(self, shard: Path) -> tuple[os.stat_result, ShardScan]:
        """``shard``'s ``stat`` (taken first: a shard changed while listed is listed again next time) and
        its listing, kept or made now.

        Raises:
            MemberError, OSError: as ``tar_members.scan_shard``; ``os.stat`` of a missing shard.
        """
        state = os.stat(shard)
        if self.folder is not None and stat.S_ISREG(state.st_mode):
            kept = read_listing(self.folder, shard, state)
            if kept is not None:
                return state, kept
        scan = tar_members.scan_shard(shard)
        if self.writable and self.folder is not None and self._unwritable is None:
            try:
                write_listing(self.folder, shard, state, scan, self.under)
            except (OSError, ValueError) as error:  # a read-only folder: the run goes on, unkept
                self._unwritable = str(error).splitlines()[0]
        return state, scan

    def report(self) -> None:
        """One warning when listings could not be kept."""
        if self._unwritable is not None:
            logger.warning(
                "cannot keep shard listings in %s (%s); the next start lists the shards again",
                self.folder,
                self._unwritable,
            )
