"""The live demo under parallel uploads, for real: a demo started on 127.0.0.1 (``visualize.py
--serve``) receives 20 uploads of 5 MB at once from 20 threads, then a stream of them one after
another; its folder never holds more than its bound, and a later upload still works."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from test_demo_bounds import model, start_demo

from captioning.cli.upload_guard import PER_CLIENT, STORED_MB, folder_bytes

__all__ = ["model"]  # a fixture of another test module


@pytest.mark.slow  # a real demo process (gradio's import and start)
def test_parallel_and_repeated_uploads_cannot_fill_the_demos_folder(model, tmp_path):
    import httpx

    demo = start_demo(model, tmp_path / "tmp")
    try:
        payload = bytes(5 * 2**20)

        def upload(number: int) -> int:
            files = {"files": (f"upload{number}.png", payload)}
            return httpx.post(f"{demo.url}/gradio_api/upload", files=files, timeout=120).status_code

        with ThreadPoolExecutor(20) as pool:
            statuses = list(pool.map(upload, range(20)))
        assert set(statuses) <= {200, 429} and statuses.count(429) >= 20 - 2 * PER_CLIENT, statuses
        # one after another: the folder's bound stops them (507) before it is passed by one upload
        statuses = [upload(100 + number) for number in range(STORED_MB // 5 + 5)]
        assert statuses.count(507) >= 5 and set(statuses) <= {200, 507}, statuses
        assert folder_bytes(demo.folder) < STORED_MB * 2**20 + len(payload)
        assert upload(999) == 507  # refused while the folder is full, the server answers all the same
        assert httpx.get(demo.url, timeout=60).status_code == 200
    finally:
        assert demo.stop() == 0
    assert "Traceback" not in demo.log.read_text(), demo.log.read_text()[-3000:]
