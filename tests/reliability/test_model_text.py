"""Text read from a model folder is data: a vocabulary's words and a folder's name are printed and
written escaped (terminal escapes, line breaks, lone surrogates, Markdown and HTML), never raw."""

from __future__ import annotations

import ast
import json
import re
import subprocess
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from tool_runs import REPO, in_process

import captioning

FIXTURE = REPO / "tests" / "fixtures" / "pre_move" / "run" / "checkpoints" / "best.pt"
# OSC title, colour, a move to the line's start, a lone surrogate (a word holding a line break or any
# whitespace is refused when the folder is read: test_hostile_weak.py)
HOSTILE = "\x1b]0;owned\x07\x1b[31mred\x1b[1Gerror:fake\ud800"


@pytest.fixture
def hostile_folder(tmp_path) -> Path:
    """A model folder whose word 4 is HOSTILE and whose output layer always picks it."""
    folder = captioning.load(FIXTURE).save_pretrained(tmp_path / "model")
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    vocab["words"][4] = HOSTILE
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")  # ensure_ascii: \ud800 stays
    weights = load_file(folder / "model.safetensors")
    weights["decoder.out.bias"] = torch.full_like(weights["decoder.out.bias"], -50.0)
    weights["decoder.out.bias"][4] = 50.0
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "captioning-model"})
    return folder


def test_evaluate_and_visualize_print_a_vocabularys_words_escaped(hostile_folder, tmp_path):
    photos = tmp_path / "photos"
    photos.mkdir()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(photos / "red.png")
    results = tmp_path / "captions.json"
    evaluated = in_process(
        "evaluate.py",
        "--checkpoint",
        hostile_folder,
        "--images",
        photos,
        "--results",
        results,
        "--no-progress",
    )
    assert evaluated.returncode == 0, evaluated.stderr
    shown = in_process(
        "visualize.py",
        photos / "red.png",
        "--checkpoint",
        hostile_folder,
        "--out-dir",
        tmp_path / "v",
        "--no-progress",
    )
    assert shown.returncode == 0, shown.stderr
    for output in (evaluated.stdout, shown.stdout):
        assert "\x1b" not in output and "\x07" not in output and "\ud800" not in output
        (line,) = [line for line in output.splitlines() if line.startswith("red.png: ")]
        assert r"\x1b]0;owned\x07\x1b[31mred\x1b[1Gerror:fake\ud800" in line  # shown, escaped, on one line
        assert not any(line.startswith("error:fake") for line in output.splitlines())
    # the results file keeps the words as they are (JSON escapes them)
    (entry,) = json.loads(results.read_text(encoding="utf-8"))
    assert entry["caption"].startswith(HOSTILE.replace("\ud800", "?"))  # valid UTF-8: no lone surrogate


NAME = "m [x](http://e) <img src=x onerror=alert(1)> `tick` | $(touch pwned)\n# not a heading"


def test_the_model_card_shows_a_folder_name_as_text_and_its_commands_quote_it(tmp_path):
    folder = captioning.load(FIXTURE).save_pretrained(tmp_path / NAME)
    card = (folder / "README.md").read_text(encoding="utf-8")
    heading = card.splitlines()[0]
    assert heading.startswith("# ") and "<img" not in heading and "](" not in heading and "\n" not in heading
    assert "&lt;img src=x onerror=alert\\(1\\)&gt;" in heading and "\\n\\# not a heading" in heading
    prose = re.sub(r"```.*?```", "", card, flags=re.S)
    assert "\n# not a heading" not in prose and "<img" not in prose and "](http" not in prose
    python = re.search(r"```python\n(.*?)```", card, re.S).group(1)
    loads = [
        n
        for n in ast.walk(ast.parse(python))
        if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "load"
    ]
    assert loads[0].args[0].value == folder.name  # the code block loads exactly this folder
    bash = re.search(r"```bash\n(.*?)```", card, re.S).group(1)
    lines = bash.strip().splitlines()
    assert len(lines) == 3  # one command a line, the name quoted in bash's $'...' with \n escaped
    name = folder.name
    quoted = "$'" + name.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\x0a") + "'"
    assert all(quoted in line for line in lines), (quoted, lines)
    decoded = subprocess.run(
        ["bash", "-c", f"printf %s {quoted}"], capture_output=True, text=True, check=True
    )
    assert decoded.stdout == name and not (tmp_path / "pwned").exists()


def test_a_scores_file_field_is_text_in_the_card(tmp_path):
    from captioning.hub.model_card import model_card

    model = captioning.load(FIXTURE)
    scores = {
        "images": "<script>x</script>",
        "file": "a](javascript:x)",
        "tokenizer": "ptb\n| forged | row |",
        "CIDEr-D": 1.5,
        "signature": "ckpt:`x`|<b>",
    }
    card = model_card("m", model.config, len(model.vocab), model.grid, 1280, {"decoder": 1}, scores)
    assert "<script>" not in card and "](javascript" not in card and "\n| forged" not in card
    assert "| 1.500 |" in card and "Signature: `` ckpt:`x`|<b> ``" in card
