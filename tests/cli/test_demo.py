"""``visualize.py --serve``: the real server on 127.0.0.1 in a subprocess, captioning through
``gradio_client`` and in headless Chromium; a taken port, a bad checkpoint and a non-image upload get
one clear line, never a traceback."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser import chromium
from messages import raises_naming
from test_faults import assert_one_line_error
from tiny_models import photo, tiny_checkpoint
from tool_runs import ONE_THREAD, REPO, in_process

import captioning
from captioning.data.shapes import ShapesFiles
from captioning.data.vocab import Vocabulary

STARTUP_S = 300  # importing gradio and torch on a busy 2-core machine can take minutes
OFFLINE = {
    **ONE_THREAD,
    "PYTHONPATH": str(REPO),
    "GRADIO_ANALYTICS_ENABLED": "False",
    "HF_HUB_OFFLINE": "1",
    "SE_OFFLINE": "true",
    "NO_PROXY": "127.0.0.1,localhost",
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def checkpoint(
    tmp_path_factory: pytest.TempPathFactory, tiny_shapes: ShapesFiles, shapes_vocab: Vocabulary
) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("demo") / "best.pt", tiny_shapes.root, shapes_vocab)


@pytest.fixture(scope="module")
def server(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``python visualize.py --serve CHECKPOINT --port N`` running; its URL. Always stopped afterwards."""
    pytest.importorskip("gradio")
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    with open(log, "w") as output:
        process = subprocess.Popen(
            [
                sys.executable,
                str(REPO / "visualize.py"),
                "--serve",
                str(checkpoint),
                "--port",
                str(port),
                "--device",
                "cpu",
            ],
            cwd=tmp_path_factory.mktemp("cwd"),
            stdout=output,
            stderr=subprocess.STDOUT,
            env=OFFLINE,
        )
    try:
        deadline = time.monotonic() + STARTUP_S
        while "http://" not in log.read_text():
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"the demo did not start (exit status {process.poll()}): {log.read_text()[-2000:]}"
                )
            time.sleep(1)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
    assert not list((REPO / "captioning").rglob("*.pyi"))  # gradio writes stubs beside subclassed components


@pytest.fixture
def not_an_image(tmp_path: Path) -> Path:
    path = tmp_path / "notes.png"
    path.write_text("these are words, not pixels\n")
    return path


@pytest.mark.slow
def test_caption_through_gradio_client_equals_the_api(server, checkpoint, tmp_path, not_an_image):
    from gradio_client import Client, handle_file

    image = photo(tmp_path / "cat.jpg")
    client = Client(server, verbose=False, download_files=str(tmp_path / "downloads"))
    text, figure, overlays = client.predict(handle_file(str(image)), "beam", 2, api_name="/caption")
    expected = captioning.load(checkpoint, device="cpu").caption([image], strategy="beam", beam_size=2)[0]
    assert text == expected.text
    assert Path(figure).is_file()
    assert [item["caption"] for item in overlays] == [
        f"{word} (beta={beta:.2f})" for word, beta in zip(expected.words, expected.beta, strict=True)
    ]
    several, _, _ = client.predict(handle_file(str(image)), "beam", 3, 3, api_name="/caption")
    ranked = captioning.load(checkpoint, device="cpu").caption([image], beam_size=3, num_return=3)[0].ranked
    assert several.splitlines() == [f"{k}. {c.text}" for k, c in enumerate(ranked, 1)]
    greedy, _, _ = client.predict(handle_file(str(image)), "greedy", 1, api_name="/caption")
    assert greedy == captioning.load(checkpoint, device="cpu").caption([image], strategy="greedy")[0].text
    with raises_naming(Exception, not_an_image.name, "PIL", one_line=False) as refused:
        client.predict(handle_file(str(not_an_image)), "beam", 2, api_name="/caption")
    assert "Traceback" not in str(refused.value) and "/tmp" not in str(refused.value)


@pytest.mark.slow
def test_the_demo_shows_several_ranked_captions(checkpoint, tmp_path):
    from captioning.cli.serve import caption_file

    image = photo(tmp_path / "cat.jpg")
    model = captioning.load(checkpoint, device="cpu")
    text, figure, overlays = caption_file(model, str(image), "beam", 3, num_return=3)
    ranked = model.caption([image], beam_size=3, num_return=3)[0].ranked
    assert text.splitlines() == [f"{k}. {c.text}" for k, c in enumerate(ranked, 1)]
    assert len({c.text for c in ranked}) == 3
    assert len(overlays) == len(ranked[0].words)  # the overlays are the first caption's words
    one, _, _ = caption_file(model, str(image), "greedy", 3, num_return=3)  # greedy gives one
    assert one == model.caption([image], strategy="greedy")[0].text


def _browser(tmp_path: Path):
    return chromium(tmp_path, (1280, 1600))


@pytest.mark.slow
@pytest.mark.skipif(
    not (shutil.which("chromium") and shutil.which("chromedriver")),
    reason="Debian's chromium and chromium-driver are not installed",
)
def test_page_shows_the_caption_after_an_upload(server, checkpoint, tmp_path, not_an_image):
    pytest.importorskip("selenium")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    image = photo(tmp_path / "cat.jpg")
    expected = captioning.load(checkpoint, device="cpu").caption([image])[0].text
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager: use the given driver, fetch nothing
    browser = _browser(tmp_path)
    try:
        browser.get(server)
        wait = WebDriverWait(browser, 120)
        upload = wait.until(
            expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "#image input[type=file]"))
        )
        upload.send_keys(str(image))

        def caption_shown(driver) -> str | None:
            value = driver.find_element(By.CSS_SELECTOR, "#caption textarea").get_attribute("value")
            return value or None

        assert wait.until(caption_shown) == expected
        assert wait.until(lambda driver: driver.find_elements(By.CSS_SELECTOR, "#figure img"))
        assert len(wait.until(lambda driver: driver.find_elements(By.CSS_SELECTOR, "#words img"))) == len(
            expected.split()
        )

        browser.get(server)  # a fresh page: an upload that is not an image
        upload = wait.until(
            expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "#image input[type=file]"))
        )
        upload.send_keys(str(not_an_image))
        wait.until(lambda driver: "PIL" in driver.find_element(By.TAG_NAME, "body").text)
        body = browser.find_element(By.TAG_NAME, "body").text  # the file named, no traceback
        assert "notes.png" in body and "PIL" in body and "Traceback" not in body
    finally:
        browser.quit()


def test_a_taken_port_is_refused_before_loading_anything(checkpoint):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = in_process("visualize.py", "--serve", checkpoint, "--port", port)
    assert_one_line_error(result.returncode, result.stderr, f"--port {port}", f"127.0.0.1:{port}", "--port N")


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("256.1.1.1", "--host 256.1.1.1: not an address or a name this machine can resolve"),
        ("192.0.2.77", "--host 192.0.2.77: not an address of this machine"),  # TEST-NET-1, never local
    ],
)
def test_a_host_that_is_no_address_of_this_machine_is_said_so(checkpoint, host, expected):
    result = in_process("visualize.py", "--serve", checkpoint, "--host", host, "--port", 7999)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {expected}") and "not free" not in line, line


def test_a_bad_checkpoint_is_one_line(tmp_path):
    bad = tmp_path / "model.pt"
    bad.write_bytes(b"not a checkpoint")
    for model in (bad, tmp_path / "missing.pt", tmp_path):
        result = in_process("visualize.py", "--serve", model, "--port", free_port())
        assert result.returncode == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {tmp_path}"), result.stderr


def test_serve_takes_the_model_itself(checkpoint):
    result = in_process("visualize.py", "--serve", checkpoint, "--checkpoint", checkpoint)
    assert result.returncode == 2
    error = result.stderr.strip().splitlines()[-1]  # the flag, and what to leave out
    assert all(flag in error for flag in ("--serve", "--checkpoint", "--split")), result.stderr
    result = in_process("visualize.py", "photo.jpg")
    assert result.returncode == 2 and "give --checkpoint" in result.stderr
