"""The live demo behind ``visualize.py --serve``: a local Gradio app over the Python API.

Upload or pick an image, choose greedy or beam search and the beam size; the page shows the
caption, ``visualize.py``'s figure and each word's attention overlay with its beta. The captions
come from ``CaptioningModel.caption`` and the pictures from ``attention_figure``: the same as
``captioning.load(...).caption([file])`` and ``visualize.py`` on that file.

Gradio is an optional extra (``pip install -e ".[demo]"``). Nothing reaches the network: no
analytics, no share link, system fonts only. Expected failures (an upload that is not an image,
an invalid option, an upload over ``MAX_UPLOAD_MB``) are shown as one-line messages in the page, never
as a traceback.

What it writes stays in one folder it owns, ``captioning-demo-*`` in the temporary folder: the example
images and gradio's cache (``GRADIO_TEMP_DIR`` points there). A session keeps only its latest upload and
answer there (what its page still shows), deleted when it asks again or ends (the tab is closed,
``Client.close()``), at the latest ``KEEP_ANSWER_S`` (answer) and ``STALE_S`` idle (upload) later
(``demo_files.RequestFiles``). The folder is removed when the demo exits, on Ctrl+C and SIGTERM too.
Every POST is bounded by what the folder holds and by what its client posted lately, requests
posting files also in flight, and the queue by its length (``captioning.cli.upload_guard``).
"""

from __future__ import annotations

import errno
import html
import io
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
from PIL import Image

from captioning.api import CaptioningModel, load
from captioning.cli.demo_files import DemoFolder, RequestFiles
from captioning.cli.upload_guard import QUEUED, guard_uploads
from captioning.config import ConfigError
from captioning.data.images import ImageError, load_image
from captioning.utils.errors import CaptioningError
from captioning.utils.extras import extra_message, preflight

DEFAULT_PORT = 7860
DEFAULT_HOST = "127.0.0.1"
EXAMPLES = 3  # Shapes images offered to pick from
MAX_UPLOAD_MB = 20  # the largest upload accepted (MiB): a 12-megapixel JPEG is 3-8 MB
MAX_UPLOAD_BYTES = MAX_UPLOAD_MB * 1024 * 1024


class DemoError(CaptioningError, RuntimeError):
    """The demo cannot start (gradio missing, the port taken); the message is one line."""


def check_port(host: str, port: int) -> None:
    """Refuse, before the model is loaded, a port out of range or already in use on ``host``.

    Raises:
        DemoError: one line naming the port and what to do.
    """
    if not 1 <= port <= 65535:
        raise DemoError(f"--port must be between 1 and 65535, got {port}")
    try:
        family, kind, protocol, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError, ValueError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise DemoError(
            f"--host {host}: not an address or a name this machine can resolve ({reason}); "
            "give e.g. 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)"
        ) from None
    with socket.socket(family, kind, protocol) as probe:
        try:
            probe.bind(address)
        except OSError as error:
            if error.errno == errno.EADDRNOTAVAIL:
                raise DemoError(
                    f"--host {host}: not an address of this machine ({error.strerror}); give one of its "
                    "addresses, 127.0.0.1 or 0.0.0.0"
                ) from None
            if error.errno == errno.EACCES:
                raise DemoError(
                    f"--port {port}: {host}:{port} needs privileges to listen on ({error.strerror}); "
                    "give a port above 1023 with --port N"
                ) from None
            raise DemoError(
                f"--port {port}: {host}:{port} is not free ({error.strerror}); "
                "give another port with --port N"
            ) from None


def _gradio() -> Any:
    """The gradio module, with its calls home turned off before it is imported."""
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import gradio
    except ImportError:
        raise DemoError(extra_message("demo", "the demo", ["gradio"])) from None
    return gradio


def _message(error: Exception, path: str | None = None, name: str | None = None) -> str:
    """One line for the page, naming an upload by its own file name rather than the server's copy."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if path and name:
        text = text.replace(str(path), name)
    return html.escape(text)


def _png(figure: Any) -> Image.Image:
    """A matplotlib figure rendered as a PIL image (the PNG ``visualize.py`` writes)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    buffer.seek(0)
    return Image.open(buffer).convert("RGB")


def caption_file(
    model: CaptioningModel,
    path: str,
    strategy: str,
    beam_size: int,
    mode: str = "bilinear",
    num_return: int = 1,
    method: str = "none",
) -> tuple[str, Image.Image, list[tuple[np.ndarray, str]]]:
    """What the page shows for one image file: the caption, ``visualize.py``'s figure, and each word's
    overlay (H, W, 3) uint8 titled ``word (beta=0.73)`` as in the figure. With an attribution
    ``method`` (``captioning.explain``), the figure is ``visualize.py --method attention,METHOD``'s
    (5 panels a line), and each word's attention overlay is followed by its ``word: METHOD`` overlay
    on that method's colour scale.

    ``num_return`` > 1 (at most ``beam_size``; greedy gives one): the text lists that many ranked
    captions, ``1. ...`` first, and the figure (the first one's attention) lists the others.

    Raises:
        ImageError, ConfigError, ValueError: the file or an option is refused (one line).
    """
    from captioning.visualization.figures import attention_figure
    from captioning.visualization.overlay import DEFAULT_CMAP, blend

    count = 1 if strategy == "greedy" else max(1, min(int(num_return), int(beam_size)))
    caption = model.caption([path], strategy=strategy, beam_size=int(beam_size), num_return=count)[0]
    picture = load_image(path)
    drawn = attention_figure(
        picture,
        caption.words,
        caption.attention,
        model.grid,
        betas=caption.beta,
        mode=mode,
        attention_label=caption.attention_label,
        text=caption.text,
        alternatives=[other.text for other in caption.alternatives],
    )
    pixels = np.asarray(
        picture.resize(drawn.image_size, Image.Resampling.BICUBIC)
        if picture.size != drawn.image_size
        else picture
    )  # (H, W, 3) uint8, as drawn
    titles = [
        word if caption.beta is None else f"{word} (beta={caption.beta[t]:.2f})"
        for t, word in enumerate(caption.words)
    ]
    overlays = [(blend(pixels, drawn.maps[t], DEFAULT_CMAP, 0.6), title) for t, title in enumerate(titles)]
    text = caption.text or "(empty caption)"
    if caption.alternatives:
        text = "\n".join(f"{k}. {c.text or '(empty caption)'}" for k, c in enumerate(caption.ranked, 1))
    figure = drawn.figure
    if method != "none":
        from captioning.visualization.method_figures import method_figure
        from captioning.visualization.overlay import scale_top, upsample_attention

        explained = model.explain(
            [path], ["attention", method], curves=False, strategy=strategy, beam_size=int(beam_size)
        )[0]
        # Wrapped at 5 panels a line, as the attention figure: the page shows it at the column's width.
        figure = method_figure(picture, caption.words, explained.maps, model.grid, mode, columns=5)
        positive = np.clip(np.asarray(explained.maps[method], dtype=np.float64), 0.0, None)  # (T, P)
        size = (pixels.shape[0], pixels.shape[1])
        shown = upsample_attention(positive, model.grid, size, mode, normalize=False) / scale_top(positive)
        beside = [(blend(pixels, np.clip(shown[t], 0.0, 1.0), DEFAULT_CMAP, 0.6), f"{word}: {method}")
                  for t, word in enumerate(caption.words)]  # fmt: skip
        overlays = [pair for both in zip(overlays, beside, strict=True) for pair in both]
    return text, _png(figure), overlays


def _examples(root: Path) -> list[str]:
    """A few Shapes images (generated, so the folder needs no data) to pick from, written in ``root``."""
    from captioning.data.shapes import generate_shapes

    files = generate_shapes(root, seed=0, num_train=0, num_val=0, num_test=EXAMPLES, image_size=224)
    return [str(path) for path in sorted((files.root / "test").glob("*.png"))]


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM stops the demo as Ctrl+C does (its ``finally`` clauses run); Python's default would end
    the process at once, leaving its folder."""
    if threading.current_thread() is not threading.main_thread():  # signal handlers live there only
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _too_large() -> str:
    return f"the image is over the demo's upload limit of {MAX_UPLOAD_MB} MB"


def _refuse_non_images(gr: Any, image: Any, files: RequestFiles | None = None) -> None:
    """Make ``image`` (a ``gr.Image``) refuse an upload PIL cannot read with ``load_image``'s one-line
    message; gradio's own would be a bare "Error". A non-image upload is deleted at once (``files``);
    an image sent inline (a ``data:`` URL, which gradio's upload limit does not see) over
    ``MAX_UPLOAD_BYTES`` is refused before it is decoded. Set on the instance: a subclass of a gradio
    component makes gradio write a ``.pyi`` stub beside the module that defines it."""
    preprocess = image.preprocess

    def checked(payload: Any) -> Any:
        url = getattr(payload, "url", None) or ""
        if url.startswith("data:") and len(url) * 3 // 4 > MAX_UPLOAD_BYTES:
            raise gr.Error(_too_large(), print_exception=False)
        if payload is not None and getattr(payload, "path", None):
            try:
                load_image(payload.path)
            except ImageError as error:
                if files is not None:
                    files.refused(payload.path)
                raise gr.Error(
                    _message(error, payload.path, payload.orig_name), print_exception=False
                ) from None
        path = preprocess(payload)
        if url.startswith("data:") and isinstance(path, str) and files is not None:
            files.adopt(path)  # decoded into gradio's cache, past its upload route
        return path

    image.preprocess = checked


def _write_answer(
    folder: Path, figure: Image.Image, overlays: list[tuple[np.ndarray, str]]
) -> tuple[str, list[tuple[str, str]]]:
    """The figure and overlays as PNG files in ``folder`` (what gradio would write in its cache, but
    where the demo knows them): the figure's path and (path, title) per word."""
    figure.save(folder / "figure.png")
    words = []
    for t, (pixels, title) in enumerate(overlays):
        path = folder / f"word-{t:03d}.png"
        Image.fromarray(pixels).save(path)
        words.append((str(path), title))
    return str(folder / "figure.png"), words


def _inputs(gr: Any, model: CaptioningModel, files: RequestFiles, examples: list[str] | None) -> tuple:
    """The demo's input column: ([image, strategy, beam size, captions, method], the Caption button),
    in the order of the ``/caption`` endpoint's parameters."""
    from captioning.explain.methods import applicable_methods

    decode = model.decode_config
    image = gr.Image(
        type="filepath", image_mode=None, label="image", sources=["upload", "clipboard"], elem_id="image"
    )
    _refuse_non_images(gr, image, files)
    strategy = gr.Radio(
        ["beam", "greedy"],
        value="greedy" if decode.strategy == "greedy" else "beam",
        label="decoding",
        elem_id="strategy",
    )
    beam_size = gr.Slider(
        1, 10, value=min(decode.beam_size, 10), step=1, label="beam size", elem_id="beam-size"
    )
    num_return = gr.Slider(
        1,
        10,
        value=min(decode.num_return, 10),
        step=1,
        label="captions (ranked; at most the beam size, greedy gives one)",
        elem_id="num-return",
    )
    methods = [name for name in applicable_methods(model.captioner.decoder) if name != "attention"]
    method = gr.Dropdown(
        ["none", *methods], value="none", label="an attribution method beside attention", elem_id="method"
    )
    button = gr.Button("Caption", variant="primary", elem_id="run")
    if examples:
        gr.Examples(examples, inputs=image, label="or pick one")
    return [image, strategy, beam_size, num_return, method], button


def build_app(model: CaptioningModel, examples: list[str] | None = None) -> Any:
    """The Gradio ``Blocks`` of the demo for ``model``; its API endpoint is ``/caption``
    (image file, strategy, beam size, captions, method) -> (caption, figure, overlays). What each
    request writes is deleted once no page shows it (``RequestFiles``)."""
    gr = _gradio()
    files = RequestFiles(Path(gr.utils.get_upload_folder()))

    def run(
        path: str | None,
        strategy: str,
        beam_size: float,
        num_return: float = 1,
        method: str = "none",
        request: Any = None,
    ) -> tuple:
        if not path:
            raise gr.Error("Upload or pick an image first.", print_exception=False)
        session = getattr(request, "session_hash", None)
        answer = files.new_answer()
        try:
            text, figure, overlays = caption_file(
                model, path, strategy, int(beam_size), num_return=int(num_return), method=method or "none"
            )
            figure_path, words = _write_answer(answer, figure, overlays)
        except (ImageError, ConfigError, ValueError) as error:
            files.discard(answer)
            files.keep(session, path, None)
            raise gr.Error(_message(error, path, Path(path).name), print_exception=False) from None
        except BaseException:
            files.discard(answer)
            raise
        files.keep(session, path, answer)
        return text, figure_path, words

    def ended(request: Any = None) -> None:
        files.end(getattr(request, "session_hash", None))

    # gradio passes the request to a parameter annotated gr.Request (resolved at run time, not as text)
    run.__annotations__["request"] = ended.__annotations__["request"] = gr.Request

    with gr.Blocks(title="captioning demo", analytics_enabled=False) as app:
        # a code span that nothing in the model's name (a folder's path) can leave: no markup reaches the page
        shown = repr(model).replace("`", "'").replace("\r", " ").replace("\n", " ")
        gr.Markdown(f"## Image captioning with visual attention\n`{shown}`")
        with gr.Row():
            with gr.Column():
                inputs, button = _inputs(gr, model, files, examples)
            with gr.Column():
                text = gr.Textbox(label="caption", interactive=False, elem_id="caption")
                figure = gr.Image(
                    label="attention (as visualize.py draws it)",
                    type="pil",
                    format="png",
                    interactive=False,
                    elem_id="figure",
                )
        overlays = gr.Gallery(
            label="each word's attention (the chosen method's beside it)",
            columns=6,
            format="png",
            elem_id="words",
        )
        outputs = [text, figure, overlays]
        button.click(run, inputs, outputs, api_name="caption")
        inputs[0].upload(run, inputs, outputs, api_name=False)
        app.unload(ended)
    files.blocks = app
    return app


def serve(
    checkpoint: str | Path,
    port: int = DEFAULT_PORT,
    host: str = DEFAULT_HOST,
    device: str = "auto",
    block: bool = True,
) -> Any:
    """Load ``checkpoint`` (a file, a model folder, or a run folder as ``captioning.load`` reads it)
    and serve the demo at ``http://host:port``.

    The port and gradio's presence are checked before the model is loaded, the model before gradio
    is imported. Uploads over ``MAX_UPLOAD_BYTES`` are refused. With ``block`` the call returns
    when the server is stopped (Ctrl+C or SIGTERM), its folder (``DemoFolder``) removed; else it
    returns the running app (``app.close()`` stops it; the folder is removed at exit).

    Raises:
        DemoError: gradio is not installed or the port is taken.
        CheckpointError: the checkpoint or folder is refused (one line naming it).
    """
    check_port(host, port)
    preflight([("demo", "the demo")], error=DemoError)
    model = load(checkpoint, device)  # a bad checkpoint fails before gradio's long import
    folder = DemoFolder()  # before gradio is imported: it reads GRADIO_TEMP_DIR then
    app = None
    try:
        with _sigterm_interrupts():
            app = _launch(model, folder, host, port)
            print(f"demo of {model.source}: http://{host}:{port} (Ctrl+C stops it)", flush=True)
            if not block:
                return app
            app.block_thread()  # returns on Ctrl+C (or SIGTERM), the server closed
    finally:
        if block or app is None:
            if "gradio" in sys.modules:
                sys.modules["gradio"].close_all()
            folder.remove()
    return app


def _launch(model: CaptioningModel, folder: DemoFolder, host: str, port: int) -> Any:
    gr = _gradio()
    examples = _examples(folder.examples)
    app = build_app(model, examples)
    app.queue(max_size=QUEUED)  # calls accepted but not run yet write nothing yet: bounded in number
    app.launch(
        server_name=host,
        server_port=port,
        share=False,
        prevent_thread_lock=True,
        show_error=False,
        quiet=True,
        ssr_mode=False,
        mcp_server=False,
        pwa=False,
        enable_monitoring=False,
        allowed_paths=[str(Path(examples[0]).parent)],
        max_file_size=MAX_UPLOAD_BYTES,
        footer_links=[],
        theme=gr.themes.Base(font=["system-ui", "sans-serif"], font_mono=["monospace"]),
    )  # no web fonts
    guard_uploads(app.server_app, folder.cache)  # uploads bounded per client and in total
    return app
