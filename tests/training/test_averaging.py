"""Weight averaging (``train.ema_decay``): the average's arithmetic, what checkpoints hold, exact resume."""

from __future__ import annotations

import pytest
import torch
from messages import raises_naming
from test_training import as_flags, data_root, one_and_two_process_runs, tiny_overrides
from tool_runs import in_process

from captioning.config import ConfigError
from captioning.config.loading import load_config
from captioning.hub.checkpoint import CheckpointError, load_checkpoint
from captioning.training.averaging import WeightAverage, trainable_parameters
from captioning.training.resume_state import check_average_state
from captioning.training.run import train

REPO = __import__("pathlib").Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("single_thread")
__all__ = ["data_root"]  # the module-scoped fixture of test_training


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    model[1].bias.requires_grad_(False)  # frozen weights are neither averaged nor stored
    return model


def test_the_average_follows_the_warmed_up_decay_and_skips_frozen_weights():
    model = _model()
    parameters = trainable_parameters({"net": model})
    assert sorted(parameters) == ["net.0.bias", "net.0.weight", "net.1.weight"]
    average = WeightAverage(parameters, decay=0.9)
    expected = model[0].weight.detach().clone()
    for step in range(1, 6):
        with torch.no_grad():
            for parameter in parameters.values():
                parameter.add_(1.0)
        average.update()
        decay = min(0.9, (1 + step) / (10 + step))  # 0.18, 0.25, ...: the first steps weigh most
        expected = decay * expected + (1 - decay) * model[0].weight.detach()
    torch.testing.assert_close(average.average["net.0.weight"], expected)
    assert average.updates == 5


def test_applied_swaps_the_average_in_and_the_optimised_weights_back_even_after_an_error():
    model = _model()
    average = WeightAverage(trainable_parameters({"net": model}), decay=0.5)
    with torch.no_grad():
        model[0].weight.add_(3.0)
    average.update()
    optimised = model[0].weight.detach().clone()
    with pytest.raises(RuntimeError, match="inside"), average.applied():
        torch.testing.assert_close(model[0].weight, average.average["net.0.weight"])
        with average.applied():  # re-entrant: still the average inside
            torch.testing.assert_close(model[0].weight, average.average["net.0.weight"])
        assert average.state_dict()["optimised"]["net.0.weight"].equal(optimised)
        raise RuntimeError("inside")
    assert model[0].weight.equal(optimised)
    assert not model[0].weight.equal(average.average["net.0.weight"])


def test_a_stored_average_restores_both_the_average_and_the_optimised_weights():
    model = _model()
    average = WeightAverage(trainable_parameters({"net": model}), decay=0.8)
    for _ in range(3):
        with torch.no_grad():
            model[0].weight.mul_(1.5)
        average.update()
    state = average.state_dict()
    with average.applied():
        averaged = {k: v.detach().clone() for k, v in model.state_dict().items()}  # what a checkpoint holds

    other = _model()
    other.load_state_dict(averaged)
    restored = WeightAverage(trainable_parameters({"net": other}), decay=0.8)
    restored.load_state_dict(state)
    assert restored.updates == 3
    torch.testing.assert_close(other[0].weight, model[0].weight)
    torch.testing.assert_close(restored.average["net.0.weight"], average.average["net.0.weight"])


@pytest.mark.parametrize(
    ("damage", "entry"),
    [
        (lambda s: None, "training.average: missing"),
        (lambda s: {**s, "updates": -1}, "training.average.updates: must be an integer >= 0"),
        (
            lambda s: {**s, "optimised": {**s["optimised"], "net.0.weight": torch.zeros(2, 2)}},
            "training.average.optimised.net.0.weight: shape (2, 2) does not match",
        ),
        (
            lambda s: {**s, "optimised": {**s["optimised"], "net.0.bias": torch.full((4,), float("nan"))}},
            "training.average.optimised.net.0.bias: holds NaN",
        ),
        (
            lambda s: {**s, "optimised": {**s["optimised"], "elsewhere\n": torch.zeros(1)}},
            "training.average.optimised: 'elsewhere\\n' is not a trainable parameter",
        ),
        (
            lambda s: {**s, "optimised": {k: v for k, v in s["optimised"].items() if k != "net.1.weight"}},
            "training.average.optimised.net.1.weight: missing",
        ),
    ],
)
def test_a_damaged_stored_average_is_refused_in_one_line_naming_the_entry(damage, entry):
    model = _model()
    parameters = trainable_parameters({"net": model})
    state = WeightAverage(parameters, decay=0.8).state_dict()
    with pytest.raises(CheckpointError) as error:
        check_average_state(damage(state), parameters, "runs/x/checkpoints/last.pt")
    message = str(error.value)
    assert message.startswith("runs/x/checkpoints/last.pt: ") and entry in message and "\n" not in message


@pytest.mark.parametrize("value", ["1", "-0.1", "nan"])
def test_a_decay_outside_zero_to_one_is_refused(value):
    with raises_naming(ConfigError, "train.ema_decay", repr(value) if value == "nan" else float(value)):
        load_config(REPO / "configs" / "shapes.yaml", {"train.ema_decay": value})


@pytest.mark.slow
def test_validation_and_checkpoints_use_the_average_and_a_stopped_run_resumes_to_the_same_weights(
    data_root, tmp_path
):
    common = {"train.ema_decay": 0.9, "train.epochs": 2, "model.decoder.dropout": 0.3}
    straight = tmp_path / "straight"
    train(
        load_config(REPO / "configs" / "shapes.yaml", tiny_overrides(data_root, straight, **common)),
        progress=False,
    )
    last = load_checkpoint(straight / "checkpoints" / "last.pt")
    optimised = last["training"]["average"]["optimised"]
    assert last["training"]["average"]["updates"] == 16
    assert set(optimised) == {f"decoder.{k}" for k in last["decoder"]}  # the frozen encoder is not averaged
    # The checkpoint's weights are the average, not the optimiser's (which move every step).
    assert any(not last["decoder"][k].equal(optimised[f"decoder.{k}"]) for k in last["decoder"])
    best = load_checkpoint(straight / "checkpoints" / "best.pt")
    if best["training"]["state"]["best_epoch"] == 2:
        for key in best["decoder"]:
            assert best["decoder"][key].equal(last["decoder"][key])

    stopped = tmp_path / "stopped"
    first = train(
        load_config(
            REPO / "configs" / "shapes.yaml",
            tiny_overrides(data_root, stopped, **common, **{"train.max_steps": 5}),
        ),
        progress=False,
    )
    first.lock.release()  # a run holds its folder until its process ends, and this one is pytest
    assert load_checkpoint(stopped / "checkpoints" / "last.pt")["training"]["average"]["updates"] == 5
    train(
        load_config(REPO / "configs" / "shapes.yaml", tiny_overrides(data_root, stopped, **common)),
        resume=stopped / "checkpoints" / "last.pt",
        progress=False,
    )
    resumed = load_checkpoint(stopped / "checkpoints" / "last.pt")
    assert resumed["training"]["average"]["updates"] == 16
    for key in last["decoder"]:
        torch.testing.assert_close(resumed["decoder"][key], last["decoder"][key], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(
            resumed["training"]["average"]["optimised"][f"decoder.{key}"],
            optimised[f"decoder.{key}"],
            rtol=1e-5,
            atol=1e-6,
        )


def test_a_resume_with_a_damaged_average_is_refused_before_any_work(data_root, tmp_path):
    run = tmp_path / "run"
    overrides = tiny_overrides(data_root, run, **{"train.ema_decay": 0.9, "train.max_steps": 2})
    train(load_config(REPO / "configs" / "shapes.yaml", overrides), progress=False).lock.release()
    path = run / "checkpoints" / "last.pt"
    payload = load_checkpoint(path)
    first = next(iter(payload["training"]["average"]["optimised"]))
    payload["training"]["average"]["optimised"][first] = torch.zeros(1, 1, 1)
    torch.save(payload, path)
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()}
    result = in_process(
        "train.py",
        "--no-progress",
        "--no-test",
        *as_flags({**overrides, "train.max_steps": 4}),
        "--resume",
        path,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    expected_shape = tuple(payload["decoder"][first.removeprefix("decoder.")].shape)
    # The file, the entry, the shape it holds and the one it must have.
    assert lines[-1].startswith(f"error: {path}: ")
    for needle in (f"training.average.optimised.{first}", "(1, 1, 1)", str(expected_shape)):
        assert needle in lines[-1], (needle, lines[-1])
    assert "Traceback" not in result.stderr
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()} == before


@pytest.mark.slow
def test_two_processes_keep_the_average_one_process_keeps_with_the_same_global_batch(data_root, tmp_path):
    one, two = one_and_two_process_runs(
        data_root,
        tmp_path,
        {"train.ema_decay": 0.5, "train.max_steps": 3, "model.decoder.dropout": 0.0, "train.batch_size": 8},
    )
    assert one["training"]["average"]["updates"] == two["training"]["average"]["updates"] == 3
    for key, value in one["decoder"].items():  # the averages
        torch.testing.assert_close(two["decoder"][key], value, rtol=1e-4, atol=1e-5)
    for key, value in one["training"]["average"]["optimised"].items():
        torch.testing.assert_close(two["training"]["average"]["optimised"][key], value, rtol=1e-4, atol=1e-5)
    assert any(
        not value.equal(one["decoder"][key.removeprefix("decoder.")])  # the average lags the weights
        for key, value in one["training"]["average"]["optimised"].items()
    )


def test_a_fine_tuned_encoders_trainable_stages_are_averaged_stored_and_resumed(data_root, tmp_path):
    overrides = tiny_overrides(
        data_root,
        tmp_path / "run",
        **{
            "train.ema_decay": 0.5,
            "model.encoder.fine_tune_stages": 1,
            "train.encoder_lr": 1e-2,
            "train.max_steps": 3,
        },
    )
    train(load_config(REPO / "configs" / "shapes.yaml", overrides), progress=False).lock.release()
    payload = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    optimised = payload["training"]["average"]["optimised"]
    encoder_keys = {key.removeprefix("encoder.") for key in optimised if key.startswith("encoder.")}
    assert encoder_keys and encoder_keys <= set(payload["encoder"])  # only the trainable stage's weights
    assert len(encoder_keys) < sum(
        1 for key, value in payload["encoder"].items() if value.is_floating_point()
    )
    # The stored encoder is the average: it lags the weights the optimiser moved.
    assert any(not payload["encoder"][key].equal(optimised[f"encoder.{key}"]) for key in encoder_keys)
    resumed = train(
        load_config(REPO / "configs" / "shapes.yaml", {**overrides, "train.max_steps": 4}),
        resume=tmp_path / "run" / "checkpoints" / "last.pt",
        progress=False,
    )
    resumed.lock.release()
    assert (
        load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["training"]["average"]["updates"] == 4
    )
