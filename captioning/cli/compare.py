"""``evaluate.py --compare`` and ``--aggregate``: existing runs' files read, compared or summed up."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from captioning.config import ConfigError
from captioning.evaluation.runner import load_boxes
from captioning.utils.files import atomic_write, same_file
from captioning.utils.output_paths import check_outputs
from captioning.utils.run_folder import scores_path_for


def compare_or_aggregate(args: argparse.Namespace, use_java: bool | None) -> dict:
    """``--compare A B --annotations REFS`` or ``--aggregate SCORES...`` (nothing is decoded).

    Only ``--out``, when given, is written: it is checked before any file is read, and may not be
    one of the inputs.
    """
    if args.checkpoint is not None or args.images is not None or args.results is not None:
        raise ConfigError(
            "--compare and --aggregate read existing files: give no --checkpoint/--images/--results"
        )
    if args.aggregate and args.compare:
        raise ConfigError("give one of --compare or --aggregate")
    if args.aggregate and (args.annotations is not None or args.instances):
        option = "--annotations" if args.annotations is not None else "--instances"
        raise ConfigError(
            f"{option}: not used by --aggregate (it reads the runs' scores files); leave it out"
        )
    results_a, results_b = _compare_groups(args) if args.compare else ([], [])
    option = "--compare" if args.compare else "--aggregate"
    inputs = [
        *((option, path) for path in args.compare or args.aggregate),
        *(("--compare (its scores)", scores_path_for(path)) for path in args.compare or ()),
        *(("--against", path) for path in getattr(args, "against", None) or ()),
        ("--annotations", args.annotations),
        *(("--aggregate", path.parent / "config.yaml") for path in args.aggregate or ()),
    ]
    if args.out is not None:
        check_outputs([("--out", args.out)], inputs)
    if args.aggregate:
        from captioning.evaluation.aggregate import aggregate_command
        from captioning.explain.seeds import seeds_section

        sections = {"faithfulness": seeds_section(args.resamples, args.seed)}
        return aggregate_command(args.aggregate, args.out, sections)
    if args.annotations is None:
        raise ConfigError("--compare needs --annotations (the reference captions of both systems' images)")
    from captioning.evaluation.compare import compare_command

    boxes = load_boxes(args.instances) if args.instances else None  # CHAIR of every run, from its captions
    from captioning.explain.compare import check_comparable, faithfulness_of

    # every run's faithfulness table read and checked before any caption is scored
    tables = [faithfulness_of(path) for path in results_a], [faithfulness_of(path) for path in results_b]
    check_comparable(*tables, [*results_a, *results_b], args.resamples)
    comparison = compare_command(
        args.annotations,
        results_a,
        results_b,
        args.out,
        use_java,
        args.spice,
        args.resamples,
        args.seed,
        args.java_timeout,
        getattr(args, "names", None),
        boxes,
        tokenizer=args.tokenizer,
        chair=args.chair_table or "released",
    )
    _compare_faithfulness(*tables, args, comparison)
    return comparison


def _compare_faithfulness(a: list, b: list, args: argparse.Namespace, comparison: dict) -> None:
    """The faithfulness rows of the systems' scores (each run's table or None, one run a side or
    several), when every run's scores hold them: printed, and added to ``--out``'s comparison."""
    from captioning.evaluation.significance import comparison_table
    from captioning.explain.compare import faithfulness_comparison, methods_not_shared

    tables_a, tables_b = [t for t in a if t is not None], [t for t in b if t is not None]
    if len(tables_a) < len(a) or len(tables_b) < len(b):
        if tables_a or tables_b:  # some runs explained, not all: say why no rows
            print("faithfulness of the maps: not compared, the scores of some runs hold no table")
        return
    rows, images = faithfulness_comparison(tables_a, tables_b, args.resamples, args.seed)
    if not rows:
        return
    names = (comparison["names"]["a"], comparison["names"]["b"])
    both = "by both" if len(a) == len(b) == 1 else f"by all {len(a) + len(b)} runs"
    print(
        f"faithfulness of the maps, {images} images explained {both} "
        "(areas: the mean over their words, x100; deletion: lower is faithful; p Holm: over these rows)"
    )
    print(comparison_table(rows, names))
    left_out = methods_not_shared([*tables_a, *tables_b])
    if left_out:
        print(f"not compared (not in every run's table): {', '.join(left_out)}")
    comparison["faithfulness"] = {name: row.to_json() for name, row in rows.items()}
    comparison["faithfulness_not_compared"] = left_out
    if args.out is not None:
        overall = {k: v for k, v in comparison.items() if k != "table"}
        atomic_write(args.out, lambda p: p.write_text(json.dumps(overall, indent=2), encoding="utf-8"))


def _compare_groups(args: argparse.Namespace) -> tuple[list[Path], list[Path]]:
    """``--compare A B`` (one run a side) or ``--compare A1 A2 ... --against B1 B2 ...`` (seeds a side)."""
    against = getattr(args, "against", None)
    if against is None:
        if len(args.compare) != 2:
            raise ConfigError(
                f"--compare takes two results files (A B), got {len(args.compare)}; to compare "
                "several runs a side give A's after --compare and B's after --against"
            )
        if same_file(*args.compare):
            raise ConfigError(
                f"--compare: {args.compare[0]} and {args.compare[1]} are the same file; give two "
                "systems' results"
            )
        return [args.compare[0]], [args.compare[1]]
    runs = [*args.compare, *against]
    for index, path in enumerate(runs):
        if any(
            same_file(path, earlier) or Path(path).resolve() == Path(earlier).resolve()
            for earlier in runs[:index]
        ):
            raise ConfigError(f"{path}: given twice: each run counts once")
    return list(args.compare), list(against)
