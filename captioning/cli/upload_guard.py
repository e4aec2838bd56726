"""Bounds on what the live demo (``captioning.cli.serve``) accepts into its folder.

Gradio keeps every file posted to its upload route (an hour, for a page that may still use it) and
bounds each file's size only; an image sent inline to the API (``/gradio_api/call/caption`` with a
``data:`` URL) is decoded into the same folder, and every answer writes its figures there (kept ten
minutes). ``UploadGuard`` wraps the demo's web app and, before a POST reaches it (any POST: a JSON
body can carry an image as well as a form), refuses with one line:

- ``507`` when the demo's folder already holds ``STORED_MB`` MiB (uploads, decoded inline images and
  answers, whatever route wrote them), until sessions end or their files go stale (``RequestFiles``);
- ``429`` when the client posted ``CLIENT_MB`` MiB of request bodies in the last ``CLIENT_WINDOW_S``
  seconds (the time an answer is kept), counted as the bodies arrive (a body announced larger is
  refused before it is read; one sent without a length, or longer than it said, is cut where it
  passes the bound): one client cannot take the whole folder, nor the demo's memory;
- ``429`` when the client already has ``PER_CLIENT`` requests posting files (forms) in flight, or all
  clients ``IN_FLIGHT``.

What a request already accepted adds is bounded too: one body (the demo's upload limit) per
request in flight, and the demo's queue holds at most ``QUEUED`` calls (``serve``). So parallel or
repeated requests cannot fill the disk, and the files already there keep being served.

Gradio spools each file part of a posted form into a temporary file at the top of its folder and
moves only the parts named ``files`` into place (a folder of their own); a part named otherwise, or
one cut off without its closing boundary, would stay there until the demo stops. When the last
request posting files ends, the guard removes every file that appeared at the top of the folder
while such requests ran (what gradio keeps is never there), so nothing spooled outlives its request.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

PER_CLIENT = 2  # requests posting files in flight from one client address
IN_FLIGHT = 8  # requests posting files in flight from all clients
STORED_MB = 200  # the demo's folder may hold this much before uploads wait (10 of the largest uploads)
CLIENT_MB = 60  # request bodies one client may post within CLIENT_WINDOW_S (3 of the largest uploads)
CLIENT_WINDOW_S = 600.0  # as long as an answer is kept (demo_files.KEEP_ANSWER_S)
QUEUED = 16  # calls waiting in the demo's queue (what they will write is not in the folder yet)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def folder_bytes(folder: Path) -> int:
    """The bytes of the files under ``folder`` (links not followed; files that vanish meanwhile skipped)."""
    total = 0
    for root, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


class UploadGuard:
    """An ASGI app in front of ``app`` bounding requests that post files (module docstring).

    Args:
        app: the demo's web app.
        folder: where the demo stores uploads and answers (gradio's cache).
        stored_bytes: the most ``folder`` may hold before posting files is refused.
    """

    def __init__(
        self,
        app: App,
        folder: Path,
        stored_bytes: int = STORED_MB * 2**20,
        client_bytes: int = CLIENT_MB * 2**20,
    ) -> None:
        self.app, self.folder, self.stored_bytes, self.client_bytes = app, folder, stored_bytes, client_bytes
        self.active: Counter[str] = Counter()  # client address -> requests posting files in flight
        self.before: set[str] = set()  # the top of the folder when the first of them began
        self.posted: dict[str, deque[tuple[float, int]]] = {}  # client -> (time, body bytes) received

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        client = (scope.get("client") or ("?", 0))[0]
        if folder_bytes(self.folder) >= self.stored_bytes:
            limit = self.stored_bytes // 2**20
            await _refuse(send, 507, f"the demo holds its limit of {limit} MB of files; retry later")
            return
        if self._posted(client) + _announced(scope) > self.client_bytes:
            await _refuse(send, 429, self._over(client))
            return
        receive, send = self._counted(client, receive, send)
        if not self._posts_files(scope):
            await self.app(scope, receive, send)
            return
        if self.active[client] >= PER_CLIENT or sum(self.active.values()) >= IN_FLIGHT:
            await _refuse(send, 429, f"too many uploads at once (at most {PER_CLIENT} per client); retry")
            return
        if not self.active:
            self.before = _top_files(self.folder)
        self.active[client] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.active[client] -= 1
            if not self.active[client]:
                del self.active[client]
            if not self.active:  # no request spools now: what the ended ones left at the top goes
                for name in _top_files(self.folder) - self.before:
                    with contextlib.suppress(OSError):
                        os.unlink(self.folder / name)

    def _posted(self, client: str) -> int:
        """The body bytes ``client`` posted within the window (older records dropped)."""
        records = self.posted.get(client)
        if records is None:
            return 0
        now = time.monotonic()
        while records and now - records[0][0] > CLIENT_WINDOW_S:
            records.popleft()
        if not records:
            del self.posted[client]
            return 0
        return sum(size for _, size in records)

    def _counted(self, client: str, receive: Receive, send: Send) -> tuple[Receive, Send]:
        """``receive`` recording each body chunk's size for ``client`` as it arrives, and ``send``.

        A body that takes the client past its bytes (one sent in chunks without a ``content-length``,
        or longer than it announced) is cut where it does: the app is told the client left, and is
        answered 429 unless its answer had begun (what the app sends after that is dropped)."""
        state = {"started": False, "cut": False}

        async def counted() -> MutableMapping[str, Any]:
            if state["cut"]:
                return {"type": "http.disconnect"}
            message = await receive()
            size = len(message.get("body") or b"")
            if size:
                self.posted.setdefault(client, deque()).append((time.monotonic(), size))
                if self._posted(client) > self.client_bytes:
                    if not state["started"]:
                        await _refuse(send, 429, self._over(client))
                    state["cut"] = True
                    return {"type": "http.disconnect"}
            return message

        async def answered(message: MutableMapping[str, Any]) -> None:
            if state["cut"]:
                return
            state["started"] = state["started"] or message.get("type") == "http.response.start"
            await send(message)

        return counted, answered

    def _over(self, client: str) -> str:
        limit = self.client_bytes // 2**20
        return f"this client posted {limit} MB in {CLIENT_WINDOW_S / 60:.0f} minutes; retry later"

    @staticmethod
    def _posts_files(scope: Scope) -> bool:
        headers = dict(scope.get("headers") or [])
        return headers.get(b"content-type", b"").lower().startswith(b"multipart/")


def _announced(scope: Scope) -> int:
    """The body size a request's ``content-length`` announces (0 when absent or not a number: such a
    body is counted as it arrives). An enormous one is announced as it is, and refused."""
    value = dict(scope.get("headers") or []).get(b"content-length", b"0").strip()
    if not value.isdigit():
        return 0
    return int(value) if len(value) <= 30 else 10**30  # (int() of a huge digit string costs its square)


def _top_files(folder: Path) -> set[str]:
    """The names of the regular files (not links, not folders) at the top of ``folder``."""
    try:
        with os.scandir(folder) as entries:
            return {entry.name for entry in entries if entry.is_file(follow_symlinks=False)}
    except OSError:
        return set()


async def _refuse(send: Send, status: int, message: str) -> None:
    body = message.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", b"%d" % len(body)),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def guard_uploads(server: Any, folder: Path) -> None:
    """Put an ``UploadGuard`` in front of a started Starlette or FastAPI ``server``'s middleware."""
    stack = server.middleware_stack or server.build_middleware_stack()
    server.middleware_stack = UploadGuard(stack, folder)
