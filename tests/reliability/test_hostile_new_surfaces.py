"""Hostile inputs against the newest surfaces: the hallucination testbed's options and folder, and the
demo's POST guard. Each bad value is refused in one line naming it before any work (nothing generated,
nothing read, nothing written outside the data folder); a body past its client's bound is cut."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from test_demo_bounds import model, start_demo
from test_faults import assert_one_line_error
from tool_runs import in_process

from captioning.cli.upload_guard import CLIENT_MB, UploadGuard, folder_bytes
from captioning.data.shapes_hallucination import generate_shapes_hallucination

__all__ = ["model"]  # a fixture of another test module


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("data.shapes_seed", "-1"),  # numpy's seeds are non-negative: a traceback once images were drawn
        ("data.shapes_seed", str(10**23)),
        ("data.shapes_image_size", "1000000"),  # 3 TB of pixels an image
        ("data.shapes_train", str(10**12)),
        ("data.shapes_test", str(10**7)),
    ],
)
@pytest.mark.parametrize("config", ["configs/shapes_hallucination.yaml", "configs/shapes.yaml"])
def test_the_testbeds_counts_sizes_and_seed_are_bounded_before_anything_is_generated(
    tmp_path: Path, config: str, option: str, value: str
):
    root = tmp_path / "data"
    result = in_process(
        "train.py", "--config", str(Path(__file__).parents[2] / config), "--set", f"{option}={value}",
        "--set", f"data.root={root}", "--output-dir", str(tmp_path / "run"), "--no-progress", cwd=tmp_path,
    )  # fmt: skip
    assert_one_line_error(result.returncode, result.stderr, option, alone=False)
    assert not root.exists() and not (tmp_path / "run").exists()


CHUNK = 1000


def post(headers: list[tuple[bytes, bytes]], chunks: int) -> tuple[int | None, int, bytes]:
    """A JSON POST of ``chunks`` body chunks of CHUNK bytes through a guard allowing a client 10 of
    them, to an app that reads the body to its end and answers 200: (status sent, body bytes the app
    read, the answer's body)."""
    sent: list[dict] = []
    read = 0
    pending = [
        {"type": "http.request", "body": b"x" * CHUNK, "more_body": k < chunks - 1} for k in range(chunks)
    ]

    async def receive() -> dict:
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    async def app(scope, receive, send) -> None:  # reads the whole body, as a JSON route does
        nonlocal read
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # starlette: ClientDisconnect, nothing answered
            read += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})

    scope = {"type": "http", "method": "POST", "path": "/gradio_api/call/caption", "client": ("10.0.0.9", 1),
             "headers": [(b"content-type", b"application/json"), *headers]}  # fmt: skip
    guard = UploadGuard(app, Path(__file__).parent / "no-such-folder", client_bytes=10 * CHUNK)
    asyncio.run(guard(scope, receive, send))
    starts = [m["status"] for m in sent if m["type"] == "http.response.start"]
    assert len(starts) <= 1, sent  # one answer, never two
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return (starts[0] if starts else None), read, body


@pytest.mark.parametrize(
    "length",
    [
        None,  # chunked: no content-length at all
        b"2000",  # announced within the bound, longer when it comes
        b"-5",  # not a length
        b"lots",
        b"12 000",
    ],
)
def test_a_body_past_the_clients_bytes_is_cut_where_it_passes_them_whatever_it_announced(length):
    headers = [] if length is None else [(b"content-length", length)]
    status, read, body = post(headers, chunks=10_000)  # 10 MB against a bound of 10 kB
    assert status == 429 and b"this client posted" in body
    assert read <= 10 * CHUNK  # the app never held more than the client's bytes
    assert post(headers, chunks=5)[:2] == (200, 5 * CHUNK)  # a body within the bound is served whole


@pytest.mark.parametrize("length", [b"9" * 20, b"9" * 25, b"9" * 5000])  # past 64 bits; past int()'s digits
def test_an_enormous_content_length_is_refused_before_the_body_is_read(length):
    status, read, body = post([(b"content-length", length)], chunks=3)
    assert (status, read) == (429, 0) and b"this client posted" in body


SMALL = ["data.shapes_train=6", "data.shapes_val=2", "data.shapes_test=2", "data.shapes_image_size=64"]


def train_on(root: Path, tmp_path: Path):
    flags = [flag for option in [*SMALL, f"data.root={root}"] for flag in ("--set", option)]
    config = str(Path(__file__).parents[2] / "configs/shapes_hallucination.yaml")
    return in_process(
        "train.py", "--config", config, *flags, "--output-dir", str(tmp_path / "run"), "--epochs", "1",
        "--max-steps", "1", "--no-test", "--no-progress", cwd=tmp_path,
    )  # fmt: skip


def planted_split_folder(root: Path, outside: Path) -> str:
    shutil.rmtree(root / "test")
    (root / "test").symlink_to(outside, target_is_directory=True)
    (root / "shapes_manifest.json").unlink()  # the folder is generated again: through the link, once
    return str(root / "test")


def planted_split_file(root: Path, outside: Path) -> str:
    (root / "dataset_shapes.json").unlink()
    (root / "dataset_shapes.json").symlink_to(outside / "victim.json")
    (root / "shapes_manifest.json").unlink()
    return str(root / "dataset_shapes.json")


def planted_image(root: Path, outside: Path) -> str:
    image = sorted((root / "train").glob("*.png"))[0]
    image.unlink()
    image.symlink_to(outside / "victim.json")  # read as an image, or written through on a rebuild
    return str(image)


@pytest.mark.parametrize("plant", [planted_split_folder, planted_split_file, planted_image])
def test_a_link_planted_in_the_testbeds_folder_is_refused_and_nothing_outside_is_written(tmp_path, plant):
    root, outside = tmp_path / "data", tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.json").write_text("kept", encoding="utf-8")
    generate_shapes_hallucination(root, num_train=6, num_val=2, num_test=2, image_size=64)
    link = plant(root, outside)
    result = train_on(root, tmp_path)
    assert_one_line_error(result.returncode, result.stderr, link, "symbolic link", alone=False)
    assert sorted(path.name for path in outside.iterdir()) == ["victim.json"]
    assert (outside / "victim.json").read_text(encoding="utf-8") == "kept"


def test_a_data_root_that_is_a_file_is_refused_in_one_line(tmp_path):
    root = tmp_path / "data"
    root.write_text("not a folder", encoding="utf-8")
    result = train_on(root, tmp_path)
    assert_one_line_error(result.returncode, result.stderr, str(root), "not a folder", alone=False)
    assert root.read_text(encoding="utf-8") == "not a folder"


@pytest.mark.slow  # a real demo process (gradio's import and start)
def test_a_chunked_raw_api_call_past_the_clients_bytes_is_cut_on_a_running_demo(model, tmp_path):
    import httpx

    demo = start_demo(model, tmp_path / "tmp")
    try:
        sent = 0

        def chunks():  # a JSON body without a content-length, twice the client's share
            nonlocal sent
            yield b'{"data": [{"url": "data:image/png;base64,'
            while sent < 2 * CLIENT_MB * 2**20:
                sent += 2**20
                yield b"A" * 2**20
            yield b'", "meta": {"_type": "gradio.FileData"}}, "greedy", 1, 1, "none"]}'

        with httpx.Client(timeout=300) as http:
            try:
                status = http.post(
                    f"{demo.url}/gradio_api/call/caption",
                    content=chunks(),
                    headers={"content-type": "application/json"},
                ).status_code
            except httpx.HTTPError:  # the server may close the connection while the client still sends
                status = None
        assert status in (429, None)
        assert folder_bytes(demo.folder) < CLIENT_MB * 2**20
        assert httpx.get(demo.url, timeout=60).status_code == 200  # the page is still served
    finally:
        assert demo.stop() == 0
    assert "Traceback" not in demo.log.read_text(), demo.log.read_text()[-3000:]
