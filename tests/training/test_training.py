"""Training: outputs, exact resume after SIGKILL, non-finite guard, SCST, 2-process DDP equivalence."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from tool_runs import in_process

from captioning.config import DecodeConfig, LSTMDecoderConfig
from captioning.config.loading import load_config
from captioning.data.vocab import Vocabulary
from captioning.hub.checkpoint import load_checkpoint
from captioning.models.decoder import ShowAttendTellDecoder
from captioning.training import losses
from captioning.training.engine import NonFiniteLossError, rollout, scst_loss
from captioning.training.rewards import CiderDReward
from captioning.training.run import train

REPO = Path(__file__).resolve().parents[2]


def tiny_overrides(data_root: Path, output_dir: Path, **extra) -> dict:
    """A Shapes run small enough for a test: 64 px images, a 2x2 grid, a tiny decoder."""
    values = {
        "data.root": str(data_root),
        "data.shapes_train": 32,
        "data.shapes_val": 8,
        "data.shapes_test": 8,
        "data.shapes_image_size": 64,
        "model.encoder.image_size": 64,
        "model.encoder.grid_size": 0,
        "model.decoder.embed_dim": 16,
        "model.decoder.hidden_dim": 32,
        "model.decoder.attention_dim": 16,
        "model.decoder.dropout": 0.2,
        "train.output_dir": str(output_dir),
        "train.epochs": 2,
        "train.batch_size": 4,
        "train.deterministic": True,
        "train.log_every": 1,
        "decode.beam_size": 2,
        "decode.max_length": 12,
        # The demo's cosine schedule warms up over one of its epochs, longer than a tiny run: these runs
        # keep a per-epoch schedule (tests/training/test_schedules.py runs the cosine one).
        "train.schedule": "plateau",
        # One stage, the plain weights: runs that test self-critical epochs or weight averaging ask for
        # them (the shortened demo in tests/cli/test_end_to_end.py keeps the demo's).
        "train.scst_epochs": 0,
        "train.ema_decay": 0.0,
    }
    if extra.get("model.decoder.kind", "lstm") != "lstm":  # the sizes above are the LSTM's options
        values = {
            key: value
            for key, value in values.items()
            if key in ("model.decoder.dropout",) or not key.startswith("model.decoder.")
        }
    if extra.get("data.dataset", "shapes") != "shapes":  # the sizes above are the Shapes reader's options
        values = {key: value for key, value in values.items() if not key.startswith("data.shapes_")}
    values.update(extra)
    return values


def as_flags(overrides: dict) -> list[str]:
    return [arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    """Shapes data and its feature cache, made once and shared by the runs of this module."""
    root = tmp_path_factory.mktemp("shapes")
    config = load_config(
        REPO / "configs" / "shapes.yaml",
        tiny_overrides(root, tmp_path_factory.mktemp("warmup"), **{"train.epochs": 0}),
    )
    from captioning.training.run import build_run_model, run_datasets
    from captioning.utils.device import resolve_device
    from captioning.utils.distributed import ProcessGroup

    device = resolve_device("cpu")
    records, model = build_run_model(config, None, device, ProcessGroup())
    run_datasets(records, model, config, root, False, device)
    return root


def read_steps(output_dir: Path) -> list[dict]:
    path = output_dir / "steps.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_train(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "train.py"), "--no-test", "--no-progress", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        check=False,
        **kwargs,
    )


def train_in_process(args: list[str]) -> subprocess.CompletedProcess:
    """What ``run_train(args)`` does, in this process (tests/tool_runs.py): for runs whose exit status,
    messages and files are checked."""
    return in_process("train.py", "--no-test", "--no-progress", *args, cwd=REPO)


def run_two_processes(script: Path, *args: str | Path) -> subprocess.CompletedProcess:
    """``script`` under ``torchrun`` with 2 CPU processes (gloo), one thread each, the package importable."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(script),
            *map(str, args),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
    )


def run_train_two_processes(args: list[str]) -> subprocess.CompletedProcess:
    """train.py under ``torchrun`` with 2 CPU processes (gloo), one thread each."""
    return run_two_processes(REPO / "train.py", "--no-test", "--no-progress", "--device", "cpu", *args)


def one_and_two_process_runs(data_root: Path, tmp_path: Path, overrides: dict) -> tuple[dict, dict]:
    """``last.pt`` of one tiny run with ``overrides`` in one process and in 2 processes under torchrun."""
    single, double = tmp_path / "single", tmp_path / "ddp"
    result = train_in_process(as_flags(tiny_overrides(data_root, single, **overrides)))
    assert result.returncode == 0, result.stderr[-3000:]
    result = run_train_two_processes(as_flags(tiny_overrides(data_root, double, **overrides)))
    assert result.returncode == 0, result.stderr[-3000:]
    return load_checkpoint(single / "checkpoints" / "last.pt"), load_checkpoint(
        double / "checkpoints" / "last.pt"
    )


@pytest.mark.slow
def test_train_writes_checkpoints_logs_and_history(data_root, tmp_path):
    config = load_config(REPO / "configs" / "shapes.yaml", tiny_overrides(data_root, tmp_path / "run"))
    outputs = train(config, progress=False)
    run = tmp_path / "run"
    for name in ("checkpoints/last.pt", "checkpoints/best.pt", "config.yaml", "vocab.json", "history.json"):
        assert (run / name).is_file(), name
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    history = json.loads((run / "history.json").read_text())["epochs"]
    assert [h["epoch"] for h in history] == [1, 2]
    assert all("val_CIDEr-D" in h and "val_BLEU-4" in h for h in history)
    steps = read_steps(run)
    assert [s["step"] for s in steps] == list(range(1, 17))  # 32 images / 4 per batch x 2 epochs
    assert outputs.state.global_step == 16
    payload = load_checkpoint(run / "checkpoints" / "last.pt")
    assert payload["training"]["state"]["epoch"] == 2
    assert load_config(run / "config.yaml") == config


@pytest.mark.slow
def test_resume_after_sigkill_equals_uninterrupted_run(data_root, tmp_path):
    common = {"train.epochs": 3, "train.checkpoint_every": 2, "model.decoder.dropout": 0.3}
    straight = tmp_path / "straight"
    result = run_train(as_flags(tiny_overrides(data_root, straight, **common)))
    assert result.returncode == 0, result.stderr

    killed = tmp_path / "killed"
    flags = as_flags(tiny_overrides(data_root, killed, **common))
    process = subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), "--no-test", "--no-progress", *flags],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        log = killed / "steps.jsonl"
        if log.exists() and len(log.read_text().splitlines()) >= 11:
            os.kill(process.pid, signal.SIGKILL)
            break
        time.sleep(0.01)
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    interrupted_at = load_checkpoint(killed / "checkpoints" / "last.pt")["training"]["state"]["global_step"]
    assert 0 < interrupted_at < 24

    result = run_train([*flags, "--resume"])
    assert result.returncode == 0, result.stderr
    assert f"step {interrupted_at}" in result.stdout
    expected, resumed = read_steps(straight), read_steps(killed)
    assert [s["step"] for s in resumed] == [s["step"] for s in expected] == list(range(1, 25))
    np.testing.assert_allclose([s["loss"] for s in resumed], [s["loss"] for s in expected], rtol=1e-6)
    final_a = load_checkpoint(straight / "checkpoints" / "last.pt")["decoder"]
    final_b = load_checkpoint(killed / "checkpoints" / "last.pt")["decoder"]
    for key in final_a:
        torch.testing.assert_close(final_a[key], final_b[key], rtol=1e-5, atol=1e-6)


def _poison_after(monkeypatch, step: int) -> None:
    """Make the cross-entropy NaN from the ``step``-th call on."""
    calls = {"n": 0}
    original = losses.caption_loss  # what the cross-entropy objective computes

    def poisoned(*args, **kwargs):
        calls["n"] += 1
        terms = original(*args, **kwargs)
        if calls["n"] >= step:
            terms.total = terms.total * float("nan")
        return terms

    monkeypatch.setattr(losses, "caption_loss", poisoned)


@pytest.mark.slow
def test_nonfinite_loss_stops_without_writing_a_checkpoint(data_root, tmp_path, monkeypatch):
    config = load_config(
        REPO / "configs" / "shapes.yaml",
        tiny_overrides(data_root, tmp_path / "run", **{"train.checkpoint_every": 2}),
    )
    _poison_after(monkeypatch, 4)
    with pytest.raises(NonFiniteLossError, match="non-finite loss"):
        train(config, progress=False)
    payload = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    assert payload["training"]["state"]["global_step"] == 2  # the checkpoint before the NaN, not after
    assert all(
        torch.isfinite(v).all()
        for v in payload["decoder"].values()
        if v.is_floating_point() and v.numel() > 1
    )


@pytest.mark.slow
def test_nonfinite_loss_skip_continues(data_root, tmp_path, monkeypatch):
    config = load_config(
        REPO / "configs" / "shapes.yaml",
        tiny_overrides(data_root, tmp_path / "run", **{"train.nonfinite": "skip", "train.epochs": 1}),
    )
    _poison_after(monkeypatch, 6)
    outputs = train(config, progress=False)
    assert outputs.state.skipped_batches == 3  # batches 6, 7 and 8 of 8
    assert outputs.state.global_step == 5
    decoder = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["decoder"]
    assert all(torch.isfinite(v).all() for v in decoder.values() if v.is_floating_point() and v.numel() > 1)


@pytest.mark.slow
def test_self_critical_training_raises_the_reward():
    torch.manual_seed(0)
    words = ["<pad>", "<start>", "<end>", "<unk>", "red", "blue", "circle", "square", "a", "small"]
    vocab = Vocabulary(words)
    references = {
        1: [["a", "red", "circle"]] * 3,
        2: [["a", "blue", "square"]] * 3,
        3: [["a", "small", "circle"]] * 3,
    }
    reward = CiderDReward(references)

    def rewarder(ids, token_ids, finished):
        return reward(ids, [[vocab.itos[t] for t in row] for row in token_ids], finished)

    decoder = ShowAttendTellDecoder.from_config(
        LSTMDecoderConfig(embed_dim=16, hidden_dim=32, attention_dim=16, dropout=0.0), len(vocab), 8
    )
    annotations = torch.randn(3, 4, 8)
    batch = {"features": annotations, "image_ids": torch.tensor([1, 2, 3])}
    config = load_config(None, {"train.scst_samples": 5, "train.scst_baseline": "mean"}).train

    class Model:  # the part of Captioner that scst_loss uses
        def __init__(self, decoder):
            self.decoder = decoder

    def greedy_reward() -> float:
        decoder.eval()
        with torch.no_grad():
            result = rollout(
                decoder, annotations, lambda lp: lp.argmax(1), DecodeConfig(max_length=6, forbid_unk=False)
            )
        decoder.train()
        rows = [row[:n].tolist() for row, n in zip(result.tokens, result.lengths, strict=True)]
        return float(rewarder([1, 2, 3], rows, result.finished.tolist()).mean())

    before = greedy_reward()
    optimizer = torch.optim.Adam(decoder.parameters(), lr=5e-3)
    decoder.train()
    for _ in range(150):
        loss, _ = scst_loss(
            Model(decoder), batch, rewarder, config, DecodeConfig(max_length=6, forbid_unk=False)
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = greedy_reward()
    assert before < 1.0
    assert after > before + 2.0, (before, after)


@pytest.mark.slow
def test_two_process_ddp_matches_one_process_with_the_same_global_batch(data_root, tmp_path):
    one, two = one_and_two_process_runs(
        data_root, tmp_path, {"train.max_steps": 3, "model.decoder.dropout": 0.0, "train.batch_size": 8}
    )
    assert one["training"]["state"]["global_step"] == two["training"]["state"]["global_step"] == 3
    start = ShowAttendTellDecoder.from_config(
        LSTMDecoderConfig(embed_dim=16, hidden_dim=32, attention_dim=16),
        one["decoder"]["embedding.weight"].shape[0],
        1280,
    )
    moved = False
    for key, value in one["decoder"].items():
        torch.testing.assert_close(
            two["decoder"][key], value, rtol=1e-4, atol=1e-5, msg=lambda m, key=key: f"{key}: {m}"
        )
        moved |= key in start.state_dict() and not torch.equal(value, start.state_dict()[key])
    assert moved


SYNC_WORKER = """
import sys
from pathlib import Path

import numpy as np
import torch

from captioning.config import DecodeConfig, LSTMDecoderConfig, EncoderConfig, ModelConfig, TrainConfig
from captioning.data.vocab import Vocabulary
from captioning.models.captioner import Captioner
from captioning.utils import distributed
from captioning.training.engine import TrainState, train_one_epoch

out = Path(sys.argv[1])
group = distributed.init_from_environment("cpu")
torch.manual_seed(0)  # one starting point
vocab = Vocabulary.build([["a", "red", "circle", "left", "of", "blue", "square"]], min_count=1)
model = Captioner.build(ModelConfig(
    encoder=EncoderConfig(name="efficientnet_lite0", weights="none", image_size=64, grid_size=0,
                          fine_tune_stages=1),
    decoder=LSTMDecoderConfig(embed_dim=8, hidden_dim=16, attention_dim=8, dropout=0.0)), vocab)
model.decoder = distributed.wrap(model.decoder, group, torch.device("cpu"))
optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
torch.manual_seed(1 + group.rank)  # each process its own images and captions
words = torch.randint(4, len(vocab), (2, 2, 4))
starts, ends = torch.ones(2, 2, 1, dtype=torch.long), torch.full((2, 2, 1), 2)  # <start>, <end>
batch = {"images": torch.randn(2, 3, 64, 64), "lengths": torch.full((2, 2), 6),
         "captions": torch.cat([starts, words, ends], dim=2),
         "image_ids": torch.tensor([1, 2]) + 10 * group.rank, "indices": torch.arange(2)}


def snapshot(name):
    params = {key: value.detach().clone() for key, value in model.named_parameters()}
    torch.save(params, out / f"{name}_rank{group.rank}.pt")


snapshot("start")
train = TrainConfig(scst_samples=3, grad_clip=0.0)
options = {"decoder_config": LSTMDecoderConfig(doubly_stochastic=0.0), "world_size": group.world_size,
           "progress": False}
train_one_epoch(model, [batch], optimizer, train, TrainState(), torch.device("cpu"), **options)
snapshot("xe")
rewarder = lambda image_ids, samples, finished: np.array([float(len(s)) for s in samples])  # longer is better
train_one_epoch(model, [batch], optimizer, train, TrainState(stage="scst"), torch.device("cpu"),
                rewarder=rewarder, decode_config=DecodeConfig(max_length=8), **options)
snapshot("scst")
distributed.shutdown()
"""


@pytest.mark.slow
def test_two_processes_keep_one_model_through_fine_tuning_and_self_critical_steps(tmp_path):
    # DistributedDataParallel averages only the wrapped decoder's forward; a fine-tuned encoder
    # and the self-critical rollout (the unwrapped decoder) must be averaged too, or the
    # processes drift apart and only rank 0's copy is saved.
    script = tmp_path / "worker.py"
    script.write_text(SYNC_WORKER)
    result = run_two_processes(script, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    snaps = {
        (name, rank): torch.load(tmp_path / f"{name}_rank{rank}.pt", weights_only=True)
        for name in ("start", "xe", "scst")
        for rank in (0, 1)
    }
    for name in ("start", "xe", "scst"):
        for key, value in snaps[name, 0].items():
            torch.testing.assert_close(
                snaps[name, 1][key],
                value,
                rtol=1e-5,
                atol=1e-6,
                msg=lambda m, key=key, name=name: f"{name} {key}: {m}",
            )

    def moved(before, after, prefix):
        return [
            k
            for k in snaps[before, 0]
            if k.startswith(prefix) and not torch.equal(snaps[before, 0][k], snaps[after, 0][k])
        ]

    assert moved("start", "xe", "encoder."), "the cross-entropy step did not train the encoder"
    assert moved("xe", "scst", "decoder."), "the self-critical step did not train the decoder"


@pytest.mark.slow
def test_fine_tuning_streams_images_and_trains_only_the_last_stages(data_root, tmp_path):
    overrides = tiny_overrides(
        data_root,
        tmp_path / "run",
        **{"model.encoder.fine_tune_stages": 1, "train.encoder_lr": 1e-2, "train.max_steps": 2},
    )
    config = load_config(REPO / "configs" / "shapes.yaml", overrides)
    from captioning.models.encoders import build_encoder

    before = build_encoder(config.model.encoder).state_dict()
    train(config, progress=False)
    payload = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    after = payload["encoder"]
    assert after is not None, "a fine-tuned encoder must be saved in the checkpoint"
    changed = {
        key for key in before if before[key].is_floating_point() and not torch.equal(before[key], after[key])
    }
    last_stage = build_encoder(config.model.encoder)
    last_stage.set_trainable(1)
    trainable = {name for name, p in last_stage.named_parameters() if p.requires_grad}
    trainable_modules = {name.rsplit(".", 1)[0] for name in trainable}
    # Only the last stage moved: its weights, and the running statistics of its own BatchNorms
    # (frozen stages keep BatchNorm in eval mode, so their statistics stay put).
    assert changed and all(key.rsplit(".", 1)[0] in trainable_modules for key in changed), changed
    assert any(key in trainable for key in changed)


# ----------------------------------------------------------------------------- stages, folders, resume
@pytest.mark.slow
def test_self_critical_stage_follows_an_early_stopped_cross_entropy_stage(data_root, tmp_path, capsys):
    # lr ~ 0: epoch 2 cannot beat epoch 1, so patience 1 ends cross-entropy early; SCST must still run.
    overrides = tiny_overrides(
        data_root,
        tmp_path / "run",
        **{
            "train.epochs": 4,
            "train.early_stop_patience": 1,
            "train.lr": 1e-12,
            "train.scst_epochs": 1,
            "train.scst_samples": 2,
            "train.schedule": "step",
            "train.step_size": 1,
            "train.gamma": 0.5,
        },
    )
    outputs = train(load_config(REPO / "configs" / "shapes.yaml", overrides), progress=False)
    history = outputs.state.history
    assert [h["stage"] for h in history] == ["xe", "xe", "scst"]
    # the early stop is said and recorded, with its reason and numbers
    (stop,) = json.loads((tmp_path / "run" / "history.json").read_text())["stops"]
    assert stop == {
        "stage": "xe",
        "epoch": 2,
        "planned_epochs": 4,
        "reason": "early_stop",
        "metric": "CIDEr-D",
        "patience": 1,
        "best_metric": pytest.approx(history[0]["val_CIDEr-D"]),
        "best_epoch": 1,
    }
    printed = capsys.readouterr().out
    said = "[xe] stopped after epoch 2 of 4: early stopping: validation CIDEr-D has not improved for 1"
    assert said in printed
    assert (tmp_path / "run" / "checkpoints" / "best_scst.pt").is_file()
    # The rate each epoch used (a step schedule halves it after every epoch), not the next one.
    assert [h["lr"] for h in history[:2]] == pytest.approx([1e-12, 0.5e-12])
    assert all(path.exists() for path in outputs.files.values())


@pytest.mark.slow
def test_a_new_run_refuses_a_folder_holding_another_runs_checkpoints(data_root, tmp_path):
    run = tmp_path / "run"
    flags = as_flags(tiny_overrides(data_root, run, **{"train.max_steps": 2}))
    assert train_in_process(flags).returncode == 0
    second = train_in_process(flags)
    assert second.returncode == 2
    message = (
        f"error: {run}: holds an earlier run's checkpoints (last.pt); continue it with --resume, replace it "
        "with --set train.overwrite=true, or choose another --output-dir"
    )
    assert second.stderr.strip().splitlines() == [message]
    replaced = train_in_process([*flags, "--set", "train.max_steps=1", "--set", "train.overwrite=true"])
    assert replaced.returncode == 0, replaced.stderr
    assert [s["step"] for s in read_steps(run)] == [1]  # the earlier run's steps are gone
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 1


@pytest.mark.slow
def test_resume_refuses_a_changed_configuration(data_root, tmp_path):
    run = tmp_path / "run"
    flags = as_flags(tiny_overrides(data_root, run, **{"train.max_steps": 2}))
    assert train_in_process(flags).returncode == 0
    changed = train_in_process([*flags, "--lr", "0.5", "--resume"])
    assert changed.returncode == 2
    message = changed.stderr.strip().splitlines()
    demo_lr = load_config(REPO / "configs" / "shapes.yaml").train.lr
    assert len(message) == 1, changed.stderr  # the checkpoint, the key, both values
    assert all(name in message[0] for name in ("last.pt", "train.lr", str(demo_lr), "0.5")), message[0]
    longer = train_in_process(
        [*flags, "--set", "train.max_steps=3", "--set", "decode.beam_size=1", "--resume"]
    )
    assert longer.returncode == 0, longer.stderr  # length and decoding may change
    assert [s["step"] for s in read_steps(run)] == [1, 2, 3]


@pytest.mark.slow
def test_self_critical_stage_scales_a_fine_tuned_encoders_rate(data_root, tmp_path):
    overrides = tiny_overrides(
        data_root,
        tmp_path / "run",
        **{
            "model.encoder.fine_tune_stages": 1,
            "train.epochs": 1,
            "train.scst_epochs": 1,
            "train.scst_samples": 2,
            "train.lr": 1e-3,
            "train.encoder_lr": 1e-4,
            "train.scst_lr": 1e-5,
            "train.schedule": "none",
            "data.shapes_train": 8,
        },
    )
    train(load_config(REPO / "configs" / "shapes.yaml", overrides), progress=False)
    groups = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["training"]["optimizer"][
        "param_groups"
    ]
    assert {g["name"]: g["lr"] for g in groups} == pytest.approx({"decoder": 1e-5, "encoder": 1e-6})


@pytest.mark.parametrize("cache_only", [False, True])
def test_a_missing_encoder_weights_file_is_refused_before_the_data_are_generated(tmp_path, cache_only):
    root = tmp_path / "shapes"
    result = train_in_process(
        [
            "--set",
            f"data.root={root}",
            "--set",
            f"model.encoder.weights={tmp_path / 'missing.pth'}",
            "--output-dir",
            str(tmp_path / "run"),
            "--no-progress",
            *(["--cache-only"] if cache_only else []),
        ]
    )
    assert result.returncode == 2, result.stderr
    assert "missing.pth" in result.stderr.strip().splitlines()[-1]
    assert not root.exists() and not (tmp_path / "run").exists()  # nothing generated, nothing written
