"""Writing an ONNX export folder (``model.export(folder, format="onnx")``; the layout is
``captioning.export.folder``'s): the graphs traced with torch, hashed, and described in config.json.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from captioning.export.folder import EXPORT_FILES, QUANTISATIONS, VERSION, read_json, require, sha256
from captioning.export.graphs import export_graphs
from captioning.export.layout import GRAPHS, STEP
from captioning.hub.identity import CONFIG, ONNX_FORMAT, VOCAB
from captioning.hub.save import model_description, write_text
from captioning.models.base import AttentionView
from captioning.utils.errors import CheckpointError, InputError
from captioning.utils.files import atomic_write, not_a_regular_file, replace_folder
from captioning.utils.output_paths import check_output_folder
from captioning.utils.run_folder import CHECKPOINTS, LOCK_NAME, RunFolderError

if TYPE_CHECKING:
    from captioning.hub.save import SavableModel


def check_export_target(folder: Path, overwrite: bool) -> None:
    """Refuse, before any work, a folder the export must not replace: a run folder, a model folder or
    any folder holding other files; an earlier ONNX export only with ``overwrite``."""
    check_output_folder(folder, "export")
    if not folder.is_dir():
        return
    names = sorted(os.listdir(folder))
    if not names:
        return
    run_marks = [n for n in (CHECKPOINTS, "config.yaml", "history.json", LOCK_NAME) if n in names]
    if run_marks:
        raise RunFolderError(
            f"{folder}: a run folder (holds {', '.join(run_marks)}); export writes a folder of its own: "
            f"give a new folder, e.g. {folder / 'onnx'}"
        )
    description = _description_of(folder / CONFIG)
    external = ((description or {}).get("onnx") or {}).get("external_data") or {}
    others = [name for name in names if name not in EXPORT_FILES and name not in external]
    if others or (description or {}).get("format") != ONNX_FORMAT:
        listed = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        why = f"holds {listed}" if others else f"its {CONFIG} is not an ONNX export's"
        raise RunFolderError(f"{folder}: not an ONNX export ({why}); give a new or empty folder")
    if not overwrite:
        raise RunFolderError(f"{folder}: holds an ONNX export already; pass overwrite=True to replace it")
    for name in EXPORT_FILES:
        problem = not_a_regular_file(folder / name)
        if problem:
            raise RunFolderError(f"{folder / name}: {problem}; an export's files are regular files")


def _description_of(path: Path) -> dict | None:
    """config.json as an object, through the export's JSON reader; None when it is not one."""
    try:
        description = read_json(path)
    except CheckpointError:
        return None
    return description if isinstance(description, dict) else None


def export_onnx(
    model: SavableModel, folder: str | Path, overwrite: bool = False, quantise: str = "none"
) -> Path:
    """Write ``model`` as an ONNX export (see the module docstring), as one unit (``replace_folder``).

    The graphs are traced from a CPU copy of the model in eval mode, reporting the default attention
    map (the mean of the heads of the last layer); ``model`` itself is left as it was.

    Args:
        quantise: ``none``, or ``int8``: the decoder step's matrix products with int8 weights
            (``onnxruntime.quantization.quantize_dynamic``) for the CPU; the encoder stays float.
    Raises:
        RunFolderError: ``folder`` is a file, a run folder or holds other files (see
            ``check_export_target``), before any work.
        InputError: ``quantise`` is not one of ``QUANTISATIONS``; onnx or onnxruntime is missing.
    """
    folder = Path(folder)
    if quantise not in QUANTISATIONS:
        raise InputError(f"quantise must be one of {', '.join(QUANTISATIONS)}, got {quantise!r}")
    check_export_target(folder, overwrite)
    require("onnx")
    if quantise != "none":
        require("onnxruntime")
    captioner = copy.deepcopy(model.captioner).to("cpu").eval()
    captioner.decoder.set_attention_view(AttentionView())
    description = model_description(model, ONNX_FORMAT, VERSION)

    def write(staging: Path) -> None:
        layout = export_graphs(captioner, staging)
        if quantise == "int8":
            _quantise(staging / STEP)
        external = sorted(set(os.listdir(staging)) - set(GRAPHS))  # weights written beside a graph
        description["onnx"] = {
            "graphs": {name: sha256(staging / name) for name in GRAPHS},
            "external_data": {name: sha256(staging / name) for name in external},
            "layout": asdict(layout),
            "attention_view": asdict(captioner.decoder.attention_view),
            "attention_label": captioner.decoder.describe_attention(),
            "quantisation": quantise,
            "torch": torch.__version__,
        }
        write_text(staging / VOCAB, json.dumps(model.vocab.to_dict(), ensure_ascii=False))
        write_text(staging / CONFIG, json.dumps(description, indent=2))

    replace_folder(folder, write)
    return folder


def _quantise(path: Path) -> None:
    """``path`` replaced by its int8 dynamic quantisation (weights of MatMul and Gemm in int8)."""
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    def write(temporary: Path) -> None:
        previous = logging.root.manager.disable
        logging.disable(logging.WARNING)  # its advice to run shape inference first: the graph has the shapes
        try:
            quantize_dynamic(str(path), str(temporary), weight_type=QuantType.QInt8)
        finally:
            logging.disable(previous)

    atomic_write(path, write)


__all__ = ["check_export_target", "export_onnx"]
