"""Bounds on what the live demo (``captioning.cli.serve``) accepts into its folder from uploads.

Gradio keeps every file posted to its upload route (an hour, for a page that may still use it) and
bounds each file's size only. ``UploadGuard`` wraps the demo's web app and, before a request that
posts files (``multipart/form-data``) reaches it, refuses with one line:

- ``429`` when the client already has ``PER_CLIENT`` such requests in flight, or all clients
  ``IN_FLIGHT``;
- ``507`` when the demo's folder already holds ``STORED_MB`` MiB (uploads and answers), until
  sessions end or their files go stale (``RequestFiles``).

So parallel uploads cannot fill the disk, and the files already there keep being served.

Gradio spools each file part of a posted form into a temporary file at the top of its folder and
moves only the parts named ``files`` into place (a folder of their own); a part named otherwise, or
one cut off without its closing boundary, would stay there until the demo stops. When the last
request posting files ends, the guard removes every file that appeared at the top of the folder
while such requests ran (what gradio keeps is never there), so nothing spooled outlives its request.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

PER_CLIENT = 2  # requests posting files in flight from one client address
IN_FLIGHT = 8  # requests posting files in flight from all clients
STORED_MB = 200  # the demo's folder may hold this much before uploads wait (10 of the largest uploads)

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

    def __init__(self, app: App, folder: Path, stored_bytes: int = STORED_MB * 2**20) -> None:
        self.app, self.folder, self.stored_bytes = app, folder, stored_bytes
        self.active: Counter[str] = Counter()  # client address -> requests posting files in flight
        self.before: set[str] = set()  # the top of the folder when the first of them began

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._posts_files(scope):
            await self.app(scope, receive, send)
            return
        client = (scope.get("client") or ("?", 0))[0]
        if self.active[client] >= PER_CLIENT or sum(self.active.values()) >= IN_FLIGHT:
            await _refuse(send, 429, f"too many uploads at once (at most {PER_CLIENT} per client); retry")
            return
        if folder_bytes(self.folder) >= self.stored_bytes:
            limit = self.stored_bytes // 2**20
            await _refuse(send, 507, f"the demo holds its limit of {limit} MB of files; retry later")
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

    @staticmethod
    def _posts_files(scope: Scope) -> bool:
        if scope.get("type") != "http" or scope.get("method") != "POST":
            return False
        headers = dict(scope.get("headers") or [])
        return headers.get(b"content-type", b"").lower().startswith(b"multipart/")


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
