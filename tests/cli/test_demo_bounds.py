"""The demo's bounds, on the real server in a subprocess (``visualize.py --serve``, its temporary
folder a ``tmp_path``): an upload over ``MAX_UPLOAD_MB`` is refused in one line and not stored; a
session keeps only its latest upload and answer in gradio's cache, and nothing once it ends; the
start's ``captioning-demo-*`` folder is gone after SIGTERM and SIGINT. ``RequestFiles``' rules are
also checked directly, without gradio."""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from messages import raises_naming
from test_demo import OFFLINE, STARTUP_S, _browser, free_port
from tiny_models import pattern, photo, tiny_checkpoint
from tool_runs import REPO

from captioning.cli import demo_files
from captioning.cli.demo_files import FOLDER_PREFIX, DemoFolder, RequestFiles
from captioning.cli.serve import MAX_UPLOAD_BYTES
from captioning.data.shapes import ShapesFiles
from captioning.data.vocab import Vocabulary

UNLOAD_S = 60  # gradio runs the unload event once it sees the session's heartbeat connection close


@dataclass
class Demo:
    process: subprocess.Popen
    url: str
    tmp: Path  # its TMPDIR
    log: Path

    @property
    def folder(self) -> Path:
        """The start's own folder, the only ``captioning-demo-*`` in its temporary folder."""
        (folder,) = self.tmp.glob(f"{FOLDER_PREFIX}*")
        return folder

    def files(self) -> set[Path]:
        """Every file in the demo's temporary folder but torch's compile cache (written at import)."""
        return {
            path
            for path in self.tmp.rglob("*")
            if path.is_file() and not path.relative_to(self.tmp).parts[0].startswith("torchinductor")
        }

    def stop(self, signum: int = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            return self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise


def _default_sigint() -> None:
    """In the demo's process: SIGINT interrupts (a test runner's worker may ignore it, and the ignoring
    would be inherited)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_demo(model: Path, tmp: Path) -> Demo:
    """``python visualize.py --serve CHECKPOINT`` with ``TMPDIR=tmp``, once it prints its URL."""
    pytest.importorskip("gradio")
    tmp.mkdir(parents=True, exist_ok=True)
    port, log = free_port(), tmp.parent / f"{tmp.name}.log"
    env = {key: value for key, value in OFFLINE.items() if key != "GRADIO_TEMP_DIR"}
    with open(log, "w") as output:
        process = subprocess.Popen(
            [sys.executable, str(REPO / "visualize.py"), "--serve", str(model), "--port", str(port)]
            + ["--device", "cpu"],
            cwd=tmp.parent,
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**env, "TMPDIR": str(tmp)},
            preexec_fn=_default_sigint,
        )
    demo = Demo(process, f"http://127.0.0.1:{port}", tmp, log)
    deadline = time.monotonic() + STARTUP_S
    while "http://" not in log.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            demo.stop(signal.SIGKILL)
            pytest.fail(f"the demo did not start (exit status {process.poll()}): {log.read_text()[-2000:]}")
        time.sleep(0.5)
    return demo


@pytest.fixture(scope="module")
def model(
    tmp_path_factory: pytest.TempPathFactory, tiny_shapes: ShapesFiles, shapes_vocab: Vocabulary
) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("model") / "best.pt", tiny_shapes.root, shapes_vocab)


@pytest.fixture(scope="module")
def demo(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    running = start_demo(model, tmp_path_factory.mktemp("demo") / "tmp")
    try:
        yield running
    finally:
        running.stop()
    assert "Traceback" not in running.log.read_text(), running.log.read_text()[-3000:]


def wait_for(condition, timeout: float = UNLOAD_S) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def request_files(demo: Demo, before: set[Path]) -> list[str]:
    """What requests added to the demo's temporary folder: in gradio's cache, the path with the
    per-file folder (a hash or an answer's id) written ``*``; elsewhere, the whole path."""
    cache = demo.folder / "gradio"

    def name(path: Path) -> str:
        if not path.is_relative_to(cache):
            return str(path)
        parts = path.relative_to(cache).parts
        return "/".join(("answers", "*", *parts[2:]) if parts[0] == "answers" else ("*", *parts[1:]))

    return sorted(name(path) for path in demo.files() - before)


@pytest.mark.slow
def test_an_upload_over_the_limit_is_refused_and_not_stored(demo, tmp_path):
    import httpx
    from gradio_client import Client, handle_file

    before = demo.files()
    big = tmp_path / "big.png"
    big.write_bytes(b"\0" * (MAX_UPLOAD_BYTES + 1))
    with open(big, "rb") as upload:
        refused = httpx.post(
            f"{demo.url}/gradio_api/upload", files={"files": ("big.png", upload)}, timeout=120
        )
    assert refused.status_code == 413
    assert refused.text == f"File size exceeded maximum allowed size of {MAX_UPLOAD_BYTES} bytes."
    assert demo.files() == before  # the part already received was deleted

    # gradio_client reads the limit from the app and refuses before sending anything
    client = Client(demo.url, verbose=False, download_files=str(tmp_path / "downloads"))
    try:
        with raises_naming(ValueError, MAX_UPLOAD_BYTES, one_line=False):
            client.predict(handle_file(str(big)), "beam", 2, api_name="/caption")
    finally:
        client.close()

    # an image sent inline (a data: URL) does not pass the upload route: refused before it is decoded
    inline = "data:image/png;base64," + base64.b64encode(big.read_bytes()).decode()
    event = httpx.post(
        f"{demo.url}/gradio_api/call/caption",
        json={"data": [{"url": inline, "meta": {"_type": "gradio.FileData"}}, "beam", 2, 1, "none"]},
        timeout=120,
    ).json()["event_id"]
    answer = httpx.get(f"{demo.url}/gradio_api/call/caption/{event}", timeout=120).text
    assert "event: error" in answer and "20 MB" in answer, answer  # the limit it is over
    assert demo.files() == before


@pytest.mark.slow
def test_a_session_keeps_only_its_latest_upload_and_answer_and_nothing_once_it_ends(demo, tmp_path):
    from gradio_client import Client, handle_file

    images = [
        photo(tmp_path / "cat.jpg"),
        pattern(tmp_path / "noise-1.png", 1),
        pattern(tmp_path / "noise-2.png", 2),
    ]
    not_an_image = tmp_path / "notes.png"
    not_an_image.write_text("these are words, not pixels\n")
    before = demo.files()
    client = Client(demo.url, verbose=False, download_files=str(tmp_path / "downloads"))
    try:
        for image, strategy in zip(images + images[:1], ["beam", "greedy", "beam", "greedy"], strict=True):
            text, figure, overlays = client.predict(handle_file(str(image)), strategy, 2, api_name="/caption")
            assert Path(figure).is_file() and all(Path(item["image"]).is_file() for item in overlays)
            words = [f"answers/*/word-{t:03d}.png" for t in range(len(overlays))]
            assert request_files(demo, before) == sorted([f"*/{image.name}", "answers/*/figure.png", *words])
        with raises_naming(Exception, not_an_image.name, "PIL", one_line=False):
            client.predict(handle_file(str(not_an_image)), "beam", 2, api_name="/caption")
        assert "*/notes.png" not in request_files(demo, before)  # deleted at once
    finally:
        client.close()  # ends the session: its heartbeat connection closes
    assert wait_for(lambda: demo.files() == before), request_files(demo, before)
    assert not (demo.tmp / "gradio").exists()  # nothing in the system's temporary folder


@pytest.mark.slow
@pytest.mark.skipif(
    not (shutil.which("chromium") and shutil.which("chromedriver")),
    reason="Debian's chromium and chromium-driver are not installed",
)
def test_the_page_names_the_upload_limit_and_a_closed_tab_leaves_nothing(demo, tmp_path):
    pytest.importorskip("selenium")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    big = tmp_path / "big.png"
    big.write_bytes(b"\0" * (MAX_UPLOAD_BYTES + 1))
    images = [photo(tmp_path / "cat.jpg"), pattern(tmp_path / "noise-1.png", 1)]
    before = demo.files()
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager: use the given driver, fetch nothing
    browser = _browser(tmp_path)
    try:
        browser.get(demo.url)
        wait = WebDriverWait(browser, 120)

        def upload(path: Path) -> None:
            field = wait.until(
                expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "#image input[type=file]"))
            )
            field.send_keys(str(path))

        upload(big)
        wait.until(lambda driver: "maximum allowed size" in driver.find_element(By.TAG_NAME, "body").text)
        body = browser.find_element(By.TAG_NAME, "body").text
        assert 'File(s) exceed the maximum allowed size of 20.0 Mb: "big.png"' in body, body
        assert demo.files() == before

        for image in images:
            browser.get(demo.url)  # a fresh page each: a new session
            upload(image)
            assert wait.until(lambda driver: driver.find_elements(By.CSS_SELECTOR, "#words img"))
            # this page's answer and upload, and the one of the page before until its unload event
            assert wait_for(lambda image=image: f"*/{image.name}" in request_files(demo, before))
        words = len(browser.find_elements(By.CSS_SELECTOR, "#words img"))
        expected = sorted(
            [
                f"*/{images[-1].name}",
                "answers/*/figure.png",
                *(f"answers/*/word-{t:03d}.png" for t in range(words)),
            ]
        )  # the pages before ended (unload): only this page's upload and answer are left
        assert wait_for(lambda: request_files(demo, before) == expected), request_files(demo, before)
    finally:
        browser.quit()
    assert wait_for(lambda: demo.files() == before), request_files(demo, before)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_the_demo_folder_is_removed_when_the_demo_is_stopped(model, tmp_path, signum):
    from gradio_client import Client, handle_file

    demo = start_demo(model, tmp_path / "tmp")
    try:
        assert (demo.folder / "examples" / "test").is_dir() and (demo.folder / "gradio").is_dir()
        client = Client(demo.url, verbose=False, download_files=str(tmp_path / "downloads"))
        client.predict(handle_file(str(photo(tmp_path / "cat.jpg"))), "beam", 2, api_name="/caption")
        client.close()
    finally:
        status = demo.stop(signum)
    log = demo.log.read_text()
    assert status == 0 and "Traceback" not in log, log[-3000:]
    assert not list(demo.tmp.glob(f"{FOLDER_PREFIX}*")) and not (demo.tmp / "gradio").exists()


# RequestFiles and DemoFolder directly: the rules, without a server


def blocks(uploads: set[str], examples: set[str] = frozenset()) -> SimpleNamespace:
    """What ``RequestFiles`` reads of a gradio ``Blocks``: its uploads and the files a block keeps."""
    return SimpleNamespace(upload_file_set=uploads, blocks={0: SimpleNamespace(keep_in_cache=set(examples))})


def stored(cache: Path, name: str, content: str) -> str:
    """A file as gradio's upload route stores it: in a folder of its own in the cache."""
    path = cache / content / name
    path.parent.mkdir(parents=True)
    path.write_text(content)
    return str(path)


def answer(files: RequestFiles) -> Path:
    folder = files.new_answer()
    (folder / "figure.png").write_bytes(b"png")
    return folder


def test_request_files_keep_what_a_page_shows_and_delete_the_rest(tmp_path):
    files = RequestFiles(tmp_path)
    cat, dog, example = (
        stored(tmp_path, "cat.jpg", "a"),
        stored(tmp_path, "dog.jpg", "b"),
        stored(tmp_path, "e.png", "c"),
    )
    files.blocks = blocks({cat, dog}, {example})
    first = answer(files)
    files.keep("page", cat, first)
    second = answer(files)
    files.keep("page", cat, second)  # "Caption" again: the same upload, a new answer
    assert Path(cat).is_file() and second.is_dir() and not first.exists()
    files.keep("other page", cat, answer(files))  # the same file uploaded by another page
    files.keep("page", dog, answer(files))  # a new upload replaces the page's first
    assert Path(cat).is_file(), "another page still shows it"
    files.keep("other page", example, answer(files))  # an example picked
    assert (
        not Path(cat).exists() and not Path(cat).parent.exists() and cat not in files.blocks.upload_file_set
    )
    files.end("other page")
    files.end("page")
    assert not Path(dog).exists() and Path(example).is_file()
    assert not [path for path in tmp_path.rglob("*") if path.is_file() and str(path) != example]


def test_request_files_delete_a_refused_upload_at_once_and_stale_ones_later(tmp_path):
    files = RequestFiles(tmp_path)
    notes, unused, cat = (stored(tmp_path, name, name) for name in ("notes.png", "unused.png", "cat.jpg"))
    files.blocks = blocks({notes, unused, cat})
    files.refused(notes)
    assert not Path(notes).exists()
    shown = answer(files)
    files.keep("page", cat, shown)
    files._sessions["page"].answered -= demo_files.KEEP_ANSWER_S + 1
    files.keep("api call", cat, None)  # any request sweeps
    assert not shown.exists() and Path(unused).is_file() and Path(cat).is_file()
    files._sessions["page"].seen -= demo_files.STALE_S + 1  # the page went silent an hour ago
    old = time.time() - demo_files.STALE_S - 1
    os.utime(unused, (old, old))  # uploaded an hour ago, never captioned
    files.keep("api call", cat, None)
    assert "page" not in files._sessions and not Path(unused).exists()
    assert Path(cat).is_file(), "the API call's session still holds it"
    files.end("api call")
    assert not Path(cat).exists()


def test_the_demo_folder_holds_gradio_s_cache_and_goes_with_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    monkeypatch.delenv("GRADIO_TEMP_DIR", raising=False)
    folder = DemoFolder()
    assert folder.root.parent == tmp_path and folder.root.name.startswith(FOLDER_PREFIX)
    assert os.environ["GRADIO_TEMP_DIR"] == str(folder.cache) and folder.cache.is_dir()
    folder.remove()
    assert not folder.root.exists() and "GRADIO_TEMP_DIR" not in os.environ

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "given"))  # a folder the user chose holds it
    (tmp_path / "given").mkdir()
    folder = DemoFolder()
    assert folder.root.parent == tmp_path / "given"
    folder.remove()
    assert os.environ["GRADIO_TEMP_DIR"] == str(tmp_path / "given") and not list(
        (tmp_path / "given").iterdir()
    )
