"""The live demo behind ``visualize.py --serve``: a local Gradio app over the Python API.

Upload or pick an image, choose greedy or beam search and the beam size; the page shows the
caption, ``visualize.py``'s figure and each word's attention overlay with its beta. The captions
come from ``CaptioningModel.caption`` and the pictures from ``attention_figure``: the same as
``captioning.load(...).caption([file])`` and ``visualize.py`` on that file.

Gradio is an optional extra (``pip install -e ".[demo]"``). Nothing reaches the network: no
analytics, no share link, system fonts only. Expected failures (an upload that is not an image,
an invalid option) are shown as one-line messages in the page, never as a traceback.
"""

from __future__ import annotations

import html
import importlib.util
import io
import os
import socket
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from captioning.api import CaptioningModel, load
from captioning.config import ConfigError
from captioning.data.images import ImageError, load_image
from captioning.utils.errors import CaptioningError

DEFAULT_PORT = 7860
DEFAULT_HOST = "127.0.0.1"
EXAMPLES = 3  # Shapes images offered to pick from


class DemoError(CaptioningError, RuntimeError):
    """The demo cannot start (gradio missing, the port taken); the message is one line."""


def check_port(host: str, port: int) -> None:
    """Refuse, before the model is loaded, a port out of range or already in use on ``host``.

    Raises:
        DemoError: one line naming the port and what to do.
    """
    if not 1 <= port <= 65535:
        raise DemoError(f"--port must be between 1 and 65535, got {port}")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as error:
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
        raise DemoError('the demo needs gradio: pip install -e ".[demo]"') from None
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
    model: CaptioningModel, path: str, strategy: str, beam_size: int, mode: str = "bilinear"
) -> tuple[str, Image.Image, list[tuple[np.ndarray, str]]]:
    """What the page shows for one image file: the caption, ``visualize.py``'s figure, and each word's
    overlay (H, W, 3) uint8 titled ``word (beta=0.73)`` as in the figure.

    Raises:
        ImageError, ConfigError, ValueError: the file or an option is refused (one line).
    """
    from captioning.visualization.figures import attention_figure
    from captioning.visualization.overlay import DEFAULT_CMAP, blend

    caption = model.caption([path], strategy=strategy, beam_size=int(beam_size))[0]
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
    return caption.text or "(empty caption)", _png(drawn.figure), overlays


def _examples() -> list[str]:
    """A few Shapes images (generated, so the folder needs no data) to pick from."""
    from captioning.data.shapes import generate_shapes

    root = Path(tempfile.mkdtemp(prefix="captioning-demo-"))
    files = generate_shapes(root, seed=0, num_train=0, num_val=0, num_test=EXAMPLES, image_size=224)
    return [str(path) for path in sorted((files.root / "test").glob("*.png"))]


def _refuse_non_images(gr: Any, image: Any) -> None:
    """Make ``image`` (a ``gr.Image``) refuse an upload PIL cannot read with ``load_image``'s one-line
    message; gradio's own would be a bare "Error". Set on the instance: a subclass of a gradio component
    makes gradio write a ``.pyi`` stub beside the module that defines it."""
    preprocess = image.preprocess

    def checked(payload: Any) -> Any:
        if payload is not None and getattr(payload, "path", None):
            try:
                load_image(payload.path)
            except ImageError as error:
                raise gr.Error(
                    _message(error, payload.path, payload.orig_name), print_exception=False
                ) from None
        return preprocess(payload)

    image.preprocess = checked


def build_app(model: CaptioningModel, examples: list[str] | None = None) -> Any:
    """The Gradio ``Blocks`` of the demo for ``model``; its API endpoint is ``/caption``
    (image file, strategy, beam size) -> (caption, figure, overlays)."""
    gr = _gradio()

    def run(path: str | None, strategy: str, beam_size: float) -> tuple:
        if not path:
            raise gr.Error("Upload or pick an image first.", print_exception=False)
        try:
            return caption_file(model, path, strategy, int(beam_size))
        except (ImageError, ConfigError, ValueError) as error:
            raise gr.Error(_message(error, path, Path(path).name), print_exception=False) from None

    decode = model.decode_config
    with gr.Blocks(title="captioning demo", analytics_enabled=False) as app:
        gr.Markdown(f"## Image captioning with visual attention\n`{model!r}`")
        with gr.Row():
            with gr.Column():
                image = gr.Image(
                    type="filepath",
                    image_mode=None,
                    label="image",
                    sources=["upload", "clipboard"],
                    elem_id="image",
                )
                _refuse_non_images(gr, image)
                strategy = gr.Radio(
                    ["beam", "greedy"],
                    value="greedy" if decode.strategy == "greedy" else "beam",
                    label="decoding",
                    elem_id="strategy",
                )
                beam_size = gr.Slider(
                    1, 10, value=min(decode.beam_size, 10), step=1, label="beam size", elem_id="beam-size"
                )
                button = gr.Button("Caption", variant="primary", elem_id="run")
                if examples:
                    gr.Examples(examples, inputs=image, label="or pick one")
            with gr.Column():
                text = gr.Textbox(label="caption", interactive=False, elem_id="caption")
                figure = gr.Image(
                    label="attention (as visualize.py draws it)",
                    type="pil",
                    format="png",
                    interactive=False,
                    elem_id="figure",
                )
        overlays = gr.Gallery(label="each word's attention", columns=6, format="png", elem_id="words")
        inputs, outputs = [image, strategy, beam_size], [text, figure, overlays]
        button.click(run, inputs, outputs, api_name="caption")
        image.upload(run, inputs, outputs, api_name=False)
    return app


def serve(
    checkpoint: str | Path,
    port: int = DEFAULT_PORT,
    host: str = DEFAULT_HOST,
    device: str = "auto",
    block: bool = True,
) -> Any:
    """Load ``checkpoint`` (a file or a model folder) and serve the demo at ``http://host:port``.

    The port and gradio's presence are checked before the model is loaded, the model before gradio
    is imported. With ``block`` the call returns
    when the server is stopped (Ctrl+C); else it returns the running app (``app.close()`` stops it).

    Raises:
        DemoError: gradio is not installed or the port is taken.
        CheckpointError: the checkpoint or folder is refused (one line naming it).
    """
    check_port(host, port)
    if importlib.util.find_spec("gradio") is None:
        raise DemoError('the demo needs gradio: pip install -e ".[demo]"')
    model = load(checkpoint, device)  # a bad checkpoint fails before gradio's long import
    gr = _gradio()
    examples = _examples()
    app = build_app(model, examples)
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
        footer_links=[],
        theme=gr.themes.Base(font=["system-ui", "sans-serif"], font_mono=["monospace"]),
    )  # no web fonts
    print(f"demo of {checkpoint}: http://{host}:{port} (Ctrl+C stops it)", flush=True)
    if not block:
        return app
    try:
        app.block_thread()
    finally:
        gr.close_all()
    return app
