"""The live demo under parallel uploads, for real: a demo started on 127.0.0.1 (``visualize.py
--serve``) receives 20 uploads of 5 MB at once from 20 threads, then a stream of them one after
another from one client and from several (other loopback addresses), and raw API calls with a 5 MB
image inline as a ``data:`` URL; its folder never holds more than its bounds, per client and in all,
and a later request still works. Parts gradio spools and does not keep (named other than ``files``,
cut off without their closing boundary) are removed when their request ends."""

from __future__ import annotations

import asyncio
import base64
import io
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_demo_bounds import model, start_demo

from captioning.cli.upload_guard import CLIENT_MB, PER_CLIENT, STORED_MB, UploadGuard, folder_bytes

__all__ = ["model"]  # a fixture of another test module


@pytest.mark.slow  # a real demo process (gradio's import and start)
def test_parallel_and_repeated_uploads_cannot_fill_the_demos_folder(model, tmp_path):
    import httpx

    demo = start_demo(model, tmp_path / "tmp")
    try:
        payload = bytes(5 * 2**20)

        def upload(number: int, client: str = "127.0.0.1") -> int:
            files = {"files": (f"upload{number}.png", payload)}
            with httpx.Client(transport=httpx.HTTPTransport(local_address=client), timeout=120) as http:
                return http.post(f"{demo.url}/gradio_api/upload", files=files).status_code

        with ThreadPoolExecutor(20) as pool:
            statuses = list(pool.map(upload, range(20)))
        assert set(statuses) <= {200, 429} and statuses.count(429) >= 20 - 2 * PER_CLIENT, statuses
        # one after another from one client: its share stops them (429) before it is passed by one upload
        statuses = [upload(100 + number) for number in range(CLIENT_MB // 5 + 3)]
        assert statuses.count(429) >= 3 and set(statuses) <= {200, 429}, statuses
        assert folder_bytes(demo.folder) < CLIENT_MB * 2**20 + len(payload)
        # from other clients (other loopback addresses): the folder's bound stops them all (507)
        statuses = [
            upload(
                200 + number, client=f"127.0.0.{2 + number // (CLIENT_MB // 5 - 1)}"
            )  # each within its share
            for number in range(STORED_MB // 5 + 5)
        ]
        assert statuses.count(507) >= 5 and set(statuses) <= {200, 507}, statuses
        assert folder_bytes(demo.folder) < STORED_MB * 2**20 + len(payload)
        assert upload(999) == 507  # refused while the folder is full, the server answers all the same
        assert httpx.get(demo.url, timeout=60).status_code == 200
    finally:
        assert demo.stop() == 0
    assert "Traceback" not in demo.log.read_text(), demo.log.read_text()[-3000:]


def noise_png(seed: int, side: int = 1300) -> bytes:
    """A PNG of random pixels (about 5 MB: noise does not compress), a different one per seed."""
    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.slow  # a real demo process (gradio's import and start)
def test_raw_api_calls_with_inline_images_cannot_fill_the_demos_folder(model, tmp_path):
    import httpx

    demo = start_demo(model, tmp_path / "tmp")
    try:
        before = folder_bytes(demo.folder)

        def call(seed: int, client: str = "127.0.0.1") -> int:
            inline = "data:image/png;base64," + base64.b64encode(noise_png(seed)).decode()
            image = {"url": inline, "meta": {"_type": "gradio.FileData"}}
            with httpx.Client(transport=httpx.HTTPTransport(local_address=client), timeout=300) as http:
                posted = http.post(
                    f"{demo.url}/gradio_api/call/caption", json={"data": [image, "greedy", 1, 1, "none"]}
                )
                if posted.status_code == 200:  # the call ran: its answer is read to the end
                    answer = http.get(f"{demo.url}/gradio_api/call/caption/{posted.json()['event_id']}")
                    assert "event: complete" in answer.text, answer.text[-500:]
            return posted.status_code

        statuses = [call(seed) for seed in range(CLIENT_MB // 5 + 4)]
        # each body is 4/3 of its image: the client's share is spent before the folder holds it
        assert statuses.count(429) >= 4 and set(statuses) <= {200, 429}, statuses
        assert folder_bytes(demo.folder) - before < CLIENT_MB * 2**20
        assert call(1000, client="127.0.0.2") == 200  # another client is still served
    finally:
        assert demo.stop() == 0
    assert "Traceback" not in demo.log.read_text(), demo.log.read_text()[-3000:]


def test_what_requests_spooled_and_left_goes_when_the_last_of_them_ends(tmp_path):
    (tmp_path / "kept.txt").write_text("there before", encoding="utf-8")
    first_spooled, release = asyncio.Event(), asyncio.Event()

    async def app(scope, receive, send):  # as gradio's upload route: a spooled file, the kept part moved
        name = scope["path"].strip("/")
        (tmp_path / f"tmp{name}").write_bytes(b"a part gradio does not keep")
        (tmp_path / name).mkdir()
        (tmp_path / name / "upload.png").write_bytes(b"a part gradio keeps")
        if name == "first":
            first_spooled.set()
            await release.wait()

    def request(path: str, client: str) -> dict:
        headers = [(b"content-type", b"multipart/form-data; boundary=x")]
        return {"type": "http", "method": "POST", "path": path, "client": (client, 1), "headers": headers}

    async def two_requests(guard: UploadGuard) -> None:
        first = asyncio.create_task(guard(request("/first", "10.0.0.1"), None, None))
        await first_spooled.wait()
        await guard(request("/second", "10.0.0.2"), None, None)
        # the first still runs: its spooled file may still be written, so nothing is removed yet
        assert (tmp_path / "tmpfirst").exists() and (tmp_path / "tmpsecond").exists()
        release.set()
        await first

    asyncio.run(two_requests(UploadGuard(app, tmp_path)))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["first", "kept.txt", "second"]
    assert (tmp_path / "first" / "upload.png").exists() and (tmp_path / "second" / "upload.png").exists()


@pytest.mark.slow  # a real demo process (gradio's import and start)
def test_parts_gradio_does_not_keep_leave_nothing_in_the_demos_folder(model, tmp_path):
    import httpx

    demo = start_demo(model, tmp_path / "tmp")
    try:
        before = demo.files()
        url = f"{demo.url}/gradio_api/upload"
        payload = bytes(2**20)
        other = httpx.post(url, files={"other": ("big.png", payload)}, timeout=60)
        assert other.status_code == 200 and other.json() == [], other.text  # nothing kept, as gradio says
        head = b'--cut\r\nContent-Disposition: form-data; name="files"; filename="cut.png"\r\n\r\n'
        cut = httpx.post(
            url,
            content=head + payload,  # no closing boundary
            headers={"content-type": "multipart/form-data; boundary=cut"},
            timeout=60,
        )
        assert cut.status_code in (200, 400), cut.text
        spooled = {Path(path) for path in demo.files() - before}
        assert spooled == set(), sorted(spooled)
        kept = httpx.post(url, files={"files": ("kept.png", payload)}, timeout=60)
        assert kept.status_code == 200 and len(kept.json()) == 1  # what gradio keeps stays
        assert Path(kept.json()[0]).is_file()
    finally:
        assert demo.stop() == 0
    assert "Traceback" not in demo.log.read_text(), demo.log.read_text()[-3000:]
