"""How a run takes its folder (new, overwrite, ``--resume auto``) and which checkpoint is scored, on
plain files: no model, no torch."""

from __future__ import annotations

from messages import raises_naming

from captioning.utils.run_folder import (
    RunFolderError,
    auto_resume_choice,
    best_checkpoint,
    claim_output_dir,
    look_for_resume,
)


def touch(path, text="x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_new_run_refuses_earlier_checkpoints_unless_overwrite(tmp_path, capsys):
    touch(tmp_path / "checkpoints" / "best.pt")
    notes = touch(tmp_path / "notes.txt")
    with raises_naming(
        RunFolderError, tmp_path, "best.pt", "--resume", "train.overwrite=true", "--output-dir"
    ):
        claim_output_dir(tmp_path, overwrite=False)
    assert (tmp_path / "checkpoints" / "best.pt").exists()
    claim_output_dir(tmp_path, overwrite=True)
    assert not (tmp_path / "checkpoints").exists() and notes.exists()  # the user's own file stays
    assert "deleted the earlier run's 1 files" in capsys.readouterr().out


def test_resume_auto_continues_last_starts_over_on_leftovers_and_refuses_more(tmp_path):
    assert auto_resume_choice(tmp_path, look_for_resume(tmp_path), False) == (None, False)  # empty folder
    touch(tmp_path / "config.yaml")
    touch(tmp_path / "steps.jsonl")
    assert auto_resume_choice(tmp_path, look_for_resume(tmp_path), False) == (None, True)
    touch(tmp_path / "test_scores.json")
    with raises_naming(RunFolderError, tmp_path, "--resume auto", "test_scores.json", "train.overwrite=true"):
        auto_resume_choice(tmp_path, look_for_resume(tmp_path), False)
    assert auto_resume_choice(tmp_path, look_for_resume(tmp_path), True) == (None, False)
    last = tmp_path / "checkpoints" / "last.pt"
    last.mkdir(parents=True)
    with raises_naming(RunFolderError, last, "folder", "--output-dir"):
        auto_resume_choice(tmp_path, look_for_resume(tmp_path), True)
    last.rmdir()
    touch(last)
    assert auto_resume_choice(tmp_path, look_for_resume(tmp_path), False) == (last, False)


def test_the_best_validation_metric_is_scored_a_tie_to_self_critical(tmp_path):
    folder = tmp_path / "checkpoints"
    with raises_naming(RunFolderError, folder, "checkpoint"):
        best_checkpoint(tmp_path, lambda path: 0.0)
    metrics = {"last": 0.9, "best": 1.2, "best_scst": 1.1}
    touch(folder / "last.pt")
    assert best_checkpoint(tmp_path, lambda path: metrics[path.stem]) == folder / "last.pt"
    touch(folder / "best.pt")
    touch(folder / "best_scst.pt")
    assert best_checkpoint(tmp_path, lambda path: metrics[path.stem]) == folder / "best.pt"
    metrics["best_scst"] = 1.2
    assert best_checkpoint(tmp_path, lambda path: metrics[path.stem]) == folder / "best_scst.pt"
