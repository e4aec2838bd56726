"""Every command that needs an optional extra refuses, before its first step, when the extra's module
cannot be imported: one line naming the option and the extra, no model loaded, nothing decoded or
written. The module is made unimportable as Python itself blocks an import: ``sys.modules[name] = None``
in this process, or a meta path finder in a subprocess's ``sitecustomize``."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from messages import assert_naming, raises_naming
from tiny_models import tiny_checkpoint
from tool_runs import ONE_THREAD, REPO, in_process

import captioning.cli.common
import captioning.cli.evaluate
import captioning.cli.serve
import captioning.cli.visualize
import captioning.inference.captioner
from captioning.data.shapes import ShapesFiles
from captioning.data.vocab import Vocabulary
from captioning.utils.errors import InputError, MissingExtraError
from captioning.utils.extras import CAPTUM_METHODS, EXTRAS, missing_modules, option_extras, preflight

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_shapes: ShapesFiles, shapes_vocab: Vocabulary) -> Path:
    folder = tmp_path_factory.mktemp("run")
    return tiny_checkpoint(folder / "checkpoints" / "best.pt", tiny_shapes.root, shapes_vocab)


@pytest.fixture
def loads(monkeypatch) -> list:
    """Every model load of the tools in this test, recorded (and refused: none should happen)."""
    calls: list = []

    def load(*args, **kwargs):
        calls.append(args)
        raise AssertionError("the model was loaded before the extra was checked")

    for module in (captioning.cli.common, captioning.cli.evaluate, captioning.cli.visualize):
        monkeypatch.setattr(module, "load_for_tool", load)
    monkeypatch.setattr(captioning.inference.captioner, "load_trained_captioner", load)
    monkeypatch.setattr(captioning.inference.captioner, "load_captioner", load)
    return calls


def _block(monkeypatch, *modules: str) -> None:
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)


def _refused(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert_naming(lines[0], *needles)


@pytest.mark.parametrize(
    "flags, module, needles",
    [
        (["--faithfulness"], "captum", ["--faithfulness", "captum", '".[explain]"']),
        (["--clip-score"], "open_clip", ["--clip-score", "open_clip", '".[clip]"']),
    ],
)
def test_evaluate_refuses_a_missing_extra_before_decoding(
    tmp_path, monkeypatch, loads, checkpoint, flags, module, needles
):
    _block(monkeypatch, module)
    results = tmp_path / "results.json"
    result = in_process(
        "evaluate.py", "--checkpoint", checkpoint, "--split", "test", "--no-java", "--no-progress",
        "--results", results, "--out", tmp_path / "scores.json", *flags, cwd=REPO,
    )  # fmt: skip
    _refused(result, *needles)
    assert not loads and not results.exists() and not (tmp_path / "scores.json").exists()
    assert list(tmp_path.iterdir()) == []


def test_evaluate_refuses_a_tokenizer_without_its_extra(tmp_path, monkeypatch, write_json):
    _block(monkeypatch, "jieba")
    annotations = write_json(tmp_path / "refs.json", {"images": [], "annotations": []})
    results = write_json(tmp_path / "results.json", [])
    result = in_process(
        "evaluate.py", "--annotations", annotations, "--results", results, "--tokenizer", "jieba",
        "--no-java", "--out", tmp_path / "scores.json",
    )  # fmt: skip
    _refused(result, "--tokenizer jieba", "jieba", '".[zh]"')
    assert not (tmp_path / "scores.json").exists()


def test_visualize_method_refuses_without_captum(tmp_path, monkeypatch, loads, checkpoint):
    _block(monkeypatch, "captum", "captum.attr")
    out = tmp_path / "figures"
    result = in_process(
        "visualize.py", "--checkpoint", checkpoint, "--split", "test", "--num", "2",
        "--method", "attention,gradcam", "--out-dir", out, "--no-progress", cwd=REPO,
    )  # fmt: skip
    _refused(result, "--method", "captum", '".[explain]"')
    assert not loads and not out.exists()


def test_serve_refuses_without_gradio(monkeypatch, loads, checkpoint):
    _block(monkeypatch, "gradio")
    started = []
    monkeypatch.setattr(captioning.cli.serve, "serve", lambda *a, **k: started.append(a))
    result = in_process("visualize.py", "--serve", checkpoint, "--port", "7")
    _refused(result, "--serve", "gradio", '".[demo]"')
    assert not started and not loads


def test_serve_from_python_refuses_without_gradio(monkeypatch, loads, checkpoint):
    _block(monkeypatch, "gradio")
    with socket.socket() as free:  # a port nobody listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with raises_naming(captioning.cli.serve.DemoError, "gradio", '".[demo]"'):
        captioning.cli.serve.serve(checkpoint, port=port)
    assert not loads


@pytest.mark.parametrize(
    "setting, module, needles",
    [
        ("model.encoder.name=timm:resnet18", "timm", ["timm:resnet18", '".[timm]"']),
        ("model.encoder.name=open_clip:ViT-B-32/openai", "open_clip", ["open_clip:ViT-B-32", '".[clip]"']),
        ("data.tokenizer=jieba", "jieba", ["data.tokenizer=jieba", '".[zh]"']),
        ("data.tokenizer=mecab", "fugashi", ["data.tokenizer=mecab", "fugashi", '".[ja]"']),
        ("data.dataset=webdataset", "webdataset", ["data.dataset=webdataset", '".[webdataset]"']),
    ],
)
def test_train_refuses_a_configuration_without_its_extra(tmp_path, monkeypatch, setting, module, needles):
    _block(monkeypatch, module)
    run = tmp_path / "run"
    data = tmp_path / "data"
    result = in_process(
        "train.py", "--output-dir", run, "--set", f"data.root={data}", "--set", setting, "--no-progress",
        cwd=tmp_path,
    )  # fmt: skip
    _refused(result, *needles)
    assert not run.exists() and not data.exists()  # nothing generated, cached or claimed


@pytest.mark.slow  # a real subprocess
def test_a_blocking_import_hook_in_a_real_process_is_seen(tmp_path: Path, checkpoint: Path):
    """The check asks the import system without importing: a finder that refuses captum (as an
    environment without it) stops ``evaluate.py --faithfulness`` before the split is decoded."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'captum' or name.startswith('captum.'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Block())\n",
        encoding="utf-8",
    )
    results = tmp_path / "results.json"
    env = {**ONE_THREAD, "PYTHONPATH": f"{hook}:{REPO}"}
    result = subprocess.run(
        [sys.executable, str(REPO / "evaluate.py"), "--checkpoint", str(checkpoint), "--split", "test",
         "--faithfulness", "--no-java", "--results", str(results)],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=300, check=False,
    )  # fmt: skip
    _refused(result, "--faithfulness", '".[explain]"')
    assert not results.exists()


def test_preflight_names_the_missing_modules_of_the_extra(monkeypatch):
    _block(monkeypatch, "unidic_lite")
    assert missing_modules("ja") == ["unidic_lite"]
    assert missing_modules("zh") == []
    with raises_naming(MissingExtraError, "data.tokenizer=mecab", "unidic_lite", '".[ja]"') as caught:
        preflight([("zh", "data.tokenizer=jieba"), ("ja", "data.tokenizer=mecab")])
    assert "fugashi" not in str(caught.value)  # installed: only what is missing is named


def test_every_extra_is_installed_in_the_test_environment():
    for name in EXTRAS:  # the test environment has every extra
        assert missing_modules(name) == [], name


def test_only_methods_that_call_captum_need_it():
    assert option_extras(method="attention,occlusion") == []
    assert option_extras(method="attention, gradcam") == [("explain", "--method")]
    assert option_extras(faithfulness="default") == [("explain", "--faithfulness")]  # every method
    assert option_extras(faithfulness="rollout,chefer") == []


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
def test_captum_is_needed_by_exactly_the_methods_the_table_names(
    monkeypatch, tmp_path, tiny_shapes: ShapesFiles, shapes_vocab: Vocabulary, kind
):
    """Each method that fits the model, run with captum unimportable: the ones ``CAPTUM_METHODS``
    names stop with the extra's line, the others explain without it."""
    import captioning
    from captioning.explain.methods import applicable_methods

    path = tiny_checkpoint(tmp_path / "checkpoints" / "best.pt", tiny_shapes.root, shapes_vocab, kind)
    model = captioning.load(path, device="cpu")
    image = sorted((tiny_shapes.root / "test").glob("*.png"))[0]
    _block(monkeypatch, "captum", "captum.attr")
    names = applicable_methods(model.captioner.decoder)
    assert CAPTUM_METHODS <= set(names)
    for name in names:
        if name in CAPTUM_METHODS:
            with raises_naming(InputError, "captum", '".[explain]"'):
                model.explain([image], [name], curves=False)
        else:
            (explained,) = model.explain([image], [name], curves=False)
            assert name in explained.maps
