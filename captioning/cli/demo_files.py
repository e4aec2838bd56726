"""The files of the live demo (``captioning.cli.serve``): the folder one start owns
(``DemoFolder``) and what each request wrote there, kept while a page or client can still use it
(``RequestFiles``)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KEEP_ANSWER_S = 600  # an answer's images are deleted this long after it was given, at the latest
STALE_S = 3600  # a session idle this long loses its upload; an upload no request used, too
FOLDER_PREFIX = "captioning-demo-"


class DemoFolder:
    """The folder one start of the demo owns (``captioning-demo-*`` in the temporary folder, or in a
    ``GRADIO_TEMP_DIR`` given): ``examples/`` and ``gradio/``, gradio's cache, where
    ``GRADIO_TEMP_DIR`` points while the demo runs. ``remove()`` (also run at exit) deletes it and puts
    ``GRADIO_TEMP_DIR`` back."""

    def __init__(self) -> None:
        self._previous = os.environ.get("GRADIO_TEMP_DIR")
        self.root = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX, dir=self._previous or None))
        self.examples = self.root / "examples"
        self.cache = self.root / "gradio"
        self.cache.mkdir()
        os.environ["GRADIO_TEMP_DIR"] = str(self.cache)  # read by gradio at import and per component
        atexit.register(self.remove)

    def remove(self) -> None:
        atexit.unregister(self.remove)
        shutil.rmtree(self.root, ignore_errors=True)
        if os.environ.get("GRADIO_TEMP_DIR") == str(self.cache):
            if self._previous is None:
                os.environ.pop("GRADIO_TEMP_DIR", None)
            else:
                os.environ["GRADIO_TEMP_DIR"] = self._previous


def _delete(path: str | Path) -> None:
    """Delete a file or folder in gradio's cache and the per-file folder that held it, if left empty."""
    path = Path(path)
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
    try:
        path.parent.rmdir()  # gradio stores each file in a folder named by its hash
    except OSError:
        pass


@dataclass
class _Session:
    upload: str | None = None  # the image its page shows (captioned again on "Caption")
    answer: Path | None = None  # the folder of the figure and overlays its page shows
    answered: float = 0.0  # time.monotonic() when ``answer`` was given
    seen: float = field(default_factory=time.monotonic)


class RequestFiles:
    """What the requests wrote in gradio's cache, kept while a page or client can still use it.

    A session (one page, one ``gradio_client.Client``, one call of the HTTP API) keeps its latest upload
    and latest answer. An answer is deleted when a newer one is given to the session, when the session
    ends (``end``, gradio's unload event: the tab closed, ``Client.close()``) or ``KEEP_ANSWER_S`` after
    it was given (pages and clients fetch its images at once). An upload is deleted when another
    replaces it, when the session ends or has been idle ``STALE_S``; one no request used (never
    captioned) after ``STALE_S``; one that is not an image at once. Examples and an upload another
    session holds are never deleted.

    Args:
        cache: gradio's cache folder (where answers are written).

    ``blocks`` (the app, set once built) tells which files are uploads (``Blocks.upload_file_set``) and
    which gradio keeps (``keep_in_cache``: the examples' copies).
    """

    def __init__(self, cache: Path):
        self.cache = cache
        self.blocks: Any = None
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()

    def new_answer(self) -> Path:
        """An empty folder for one answer's images, in gradio's cache (served from there, not copied)."""
        folder = self.cache / "answers" / uuid.uuid4().hex
        folder.mkdir(parents=True)
        return folder

    def keep(self, session: str | None, upload: str, answer: Path | None) -> None:
        """Record that ``session``'s page now shows ``upload`` (and ``answer``, if given); delete what
        it no longer shows, and what ended or idle sessions and unused uploads left."""
        with self._lock:
            state = self._sessions.setdefault(session or uuid.uuid4().hex, _Session())
            now = time.monotonic()
            if answer is not None:
                if state.answer is not None:
                    _delete(state.answer)
                state.answer, state.answered = answer, now
            if state.upload is not None and state.upload != upload:
                self._drop_upload(state.upload, state)
            state.upload, state.seen = upload, now
            self._sweep()

    def adopt(self, path: str) -> None:
        """``path`` is an image gradio decoded from a request (a ``data:`` URL): handled as an upload."""
        self._uploads().add(path)

    def end(self, session: str | None) -> None:
        """The session is over (its tab closed): delete its files."""
        with self._lock:
            state = self._sessions.pop(session, None) if session else None
            if state is not None:
                self._forget(state)
            self._sweep()

    def refused(self, upload: str) -> None:
        """``upload`` is not an image: no page can use it."""
        with self._lock:
            self._drop_upload(upload, None)

    def discard(self, answer: Path) -> None:
        _delete(answer)

    def _forget(self, state: _Session) -> None:
        if state.answer is not None:
            _delete(state.answer)
        if state.upload is not None:
            self._drop_upload(state.upload, state)
        state.answer = state.upload = None

    def _uploads(self) -> set[str]:
        return self.blocks.upload_file_set if self.blocks is not None else set()

    def _kept(self) -> set[str]:
        blocks = self.blocks.blocks.values() if self.blocks is not None else ()
        return set().union(*(getattr(block, "keep_in_cache", set()) for block in blocks))

    def _drop_upload(self, upload: str, owner: _Session | None) -> None:
        uploads = self._uploads()
        if upload not in uploads or upload in self._kept():
            return  # an example, or not an upload
        if any(state.upload == upload for state in self._sessions.values() if state is not owner):
            return  # another page shows the same file
        _delete(upload)
        uploads.discard(upload)

    def _sweep(self) -> None:
        now = time.monotonic()
        for key, state in list(self._sessions.items()):
            if now - state.seen > STALE_S:
                del self._sessions[key]
                self._forget(state)
            elif state.answer is not None and now - state.answered > KEEP_ANSWER_S:
                _delete(state.answer)
                state.answer = None
        held = {state.upload for state in self._sessions.values()}
        for upload in list(self._uploads()):
            if upload not in held and _age(upload) > STALE_S:
                self._drop_upload(upload, None)


def _age(path: str) -> float:
    try:
        return time.time() - os.stat(path).st_mtime
    except OSError:
        return float("inf")
