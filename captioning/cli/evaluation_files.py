"""The files ``evaluate.py`` writes: named beside its results file, checked against its inputs before
any work, and listed with what writing each did in its closing summary."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from captioning.cli.faithfulness import faithfulness_page_path
from captioning.evaluation.runner import per_image_path
from captioning.utils.files import output_note, writes_in_place
from captioning.utils.output_paths import check_outputs
from captioning.utils.run_folder import evaluation_prefix, run_folder_of, scores_path_for


def print_written(files: dict[str, Path | None], notes: dict[Path, str]) -> None:
    """The files written, each with what writing it did there; None entries were not written."""
    print("wrote:")
    for what, path in files.items():
        if path is not None:
            print(f"  {what:<22} {path}" + notes.get(path, ""))


def notes_of(*paths: Path | None) -> dict[Path, str]:
    """What each write is about to do to what stands at its path (``output_note``), for the summary."""
    return {path: output_note(path) for path in paths if path is not None}


def beside_results(results: Path, suffix: str) -> Path | None:
    """``x_results.json`` -> ``x<suffix>``, a file written beside the results file; None beside a
    device or a FIFO (/dev/null, a pipe)."""
    if writes_in_place(results):
        return None
    return results.with_name(results.stem.removesuffix("_results") + suffix)


def named_outputs(*named: tuple[str, Path | None]) -> list[tuple[str, Path]]:
    """The (option, path) of the files a command writes, leaving out those it writes none of (None)."""
    return [(option, path) for option, path in named if path is not None]


def scores_file(out: Path | None, results: Path) -> Path:
    return out if out is not None else scores_path_for(results)


@dataclass
class EvaluationFiles:
    """The files ``--checkpoint`` decoding writes, checked before the model is loaded: the results
    and, beside them, the image index (``--images``) or the scores, per-image scores and faithfulness
    page (``--split``), and every caption ranked when several are asked for; None: not written."""

    run_dir: Path
    results: Path
    named: list[tuple[str, Path]]  # (option, path) of every file written, as check_outputs names them
    inputs: list[tuple[str, Path | None]]  # the files read, which no output may be
    index: Path | None = None
    scores: Path | None = None
    page: Path | None = None
    ranked: Path | None = None

    def add_ranked(self) -> None:
        """Every caption of every image, ranked, beside the results file, checked as the others are."""
        self.ranked = beside_results(self.results, "_ranked.json")
        if self.ranked is not None:
            self.named.append(("--results (every caption, ranked)", self.ranked))
            check_outputs(self.named, self.inputs)

    def notes(self) -> dict[Path, str]:
        """What writing each file is about to do there, for the summary."""
        return notes_of(*(path for _, path in self.named))


def planned_files(args: argparse.Namespace, records: list | None, explaining: bool) -> EvaluationFiles:
    """The files decoding writes, none of them one of its inputs (``check_outputs``)."""
    # Outputs go to the run folder the checkpoint sits in (<run>/checkpoints/x.pt), else the current one,
    # under names of evaluate.py's own that never replace the main job's test_results.json & co.
    run_dir = run_folder_of(args.checkpoint)
    prefix = evaluation_prefix(args.checkpoint, "images" if records is not None else args.split)
    results = args.results or run_dir / f"{prefix}_results.json"
    inputs = [
        ("--checkpoint", args.checkpoint),
        ("--config", args.config),
        ("--data-randomised-checkpoint", getattr(args, "data_randomised_checkpoint", None)),
        *(("--instances", path) for path in args.instances or ()),
        *(("--images", record.path) for record in records or ()),
    ]
    if records is not None:
        index = beside_results(results, "_files.json")
        named = named_outputs(("--results", results), ("--results (image id -> file)", index))
        planned = EvaluationFiles(run_dir, results, named, inputs, index=index)
    else:
        scores = scores_file(args.out, results)
        page = faithfulness_page_path(scores) if explaining else None  # the faithfulness page
        named = named_outputs(
            ("--results", results),
            ("--out", scores),
            ("--out (per-image scores)", per_image_path(scores)),
            ("--out (faithfulness page)", page),
        )
        planned = EvaluationFiles(run_dir, results, named, inputs, scores=scores, page=page)
    check_outputs(planned.named, inputs)
    return planned
