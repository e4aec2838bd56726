#!/usr/bin/env python
"""The demo's cross-entropy stage with its loop in plain sight.

``python train.py`` runs the whole job through ``captioning.training`` (resume, several processes,
early stopping, self-critical epochs, the report). This script does what its cross-entropy stage
does with the library's pieces and a loop you can read and change in one sitting: records from the
dataset reader, the vocabulary, the model, the feature cache, the decoder's objective (its class
names it in ``captioning.training.losses.OBJECTIVES``: equation 14 with the doubly stochastic
penalty, or with ``model.decoder.attention: hard`` equation 12 with its REINFORCE term), Adam with a
warm-up and a cosine schedule, greedy validation CIDEr-D each epoch, and a checkpoint
``captioning.load`` reads. It leaves out what the trainer adds: exact resume, the weight average,
several processes, mixed precision, the self-critical stage. It is the place to fork a training
step.

    python examples/plain_train.py                       # the Shapes demo's configuration
    python examples/plain_train.py --set train.epochs=4  # any key of the configuration
    python examples/plain_train.py --import my_scorer.py --set model.decoder.scoring=mine

Bad input (a configuration value, a name nothing registered, an output folder that cannot be
written) is refused in one line before any work, as by ``train.py``.

On the full demo (``python examples/plain_train.py`` in the folder of a finished ``python
train.py``, reading its feature cache; then ``evaluate.py --checkpoint
runs/plain/checkpoints/plain.pt --split test``, beam 3), measured 2026-12-02 on 2 CPU cores: test
CIDEr-D 4.46 (BLEU-4 0.870, its best validation epoch the 16th). The main job's cross-entropy stage
(``best.pt``, with the weight average) scores 4.42 the same way, and its self-critical
``best_scst.pt`` 4.78 (the README's number).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from captioning.cli.common import add_import_argument, config_from_args, run_cli
from captioning.data import build_vocabulary, data_source, load_records
from captioning.data.datasets import collate_captions
from captioning.data.records import records_of_split
from captioning.data.tokenizers import detokenize
from captioning.evaluation.metrics import score_captions
from captioning.hub.checkpoint import save_checkpoint
from captioning.inference.batches import annotations_of
from captioning.inference.captioner import caption_records
from captioning.inference.inputs import caption_dataset, check_splits
from captioning.models.captioner import Captioner
from captioning.training.engine import flatten_captions
from captioning.training.losses import objective_of
from captioning.training.optim import cosine_factor
from captioning.training.plan import check_images_exist
from captioning.utils.device import resolve_device, seed_everything
from captioning.utils.errors import InputError
from captioning.utils.output_paths import check_output_file, check_output_folder


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=None, help="YAML configuration (default: the Shapes demo's)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a configuration key, e.g. train.epochs=4 (repeatable)",
    )
    parser.add_argument(
        "--output-dir", default="runs/plain", help="where checkpoints/plain.pt and the feature cache go"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    add_import_argument(parser)
    return parser


def validation_cider(model: Captioner, config, records, device, output_dir: Path, progress: bool) -> float:
    """CIDEr-D of greedy captions of ``records`` against their references (Python tokenizer)."""
    greedy = type(config.decode)(**{**vars(config.decode), "strategy": "greedy"})
    captioned = caption_records(model, config, records, device, greedy, progress, output_dir)
    candidates = {item.record.image_id: detokenize(item.words) for item in captioned}
    references = {record.image_id: list(record.raw) for record in records}
    return float(score_captions(references, candidates, use_java=False).overall["CIDEr-D"] or 0.0)


def main(args: argparse.Namespace) -> Path:
    config = config_from_args(args)  # checked, with the names it looks up in the registries
    output_dir = Path(args.output_dir)
    checkpoint = output_dir / "checkpoints" / "plain.pt"
    check_output_folder(output_dir, "--output-dir")  # before any work, as train.py
    check_output_file(checkpoint, "--output-dir")
    if config.train.epochs < 1:  # train.py's 0 epochs scores a model; here there would be none to write
        raise InputError(f"train.epochs: this loop trains at least 1 epoch, got {config.train.epochs}")
    progress = not args.no_progress
    device = resolve_device(config.train.device)
    seed_everything(config.train.seed, config.train.deterministic)

    # Data: records of each split, the vocabulary of the training captions.
    records = load_records(config.data)
    check_splits(records, config.data.dataset, ("train", "val"), data_source(config.data))
    check_images_exist(records, config.data.skip_bad_images)  # before the first is cached, as train.py
    train, val = records_of_split(records, "train"), records_of_split(records, "val")
    vocab = build_vocabulary(train, config.data.min_word_count)

    # Model: the encoder (frozen, its grids cached once) and the decoder the configuration names.
    model = Captioner.build(config.model, vocab).to(device)
    dataset = caption_dataset(
        train, model, config, device, output_dir, progress, config.train.captions_per_image
    )
    loader = DataLoader(
        dataset, batch_size=config.train.batch_size, shuffle=True, collate_fn=collate_captions
    )

    # Optimiser and schedule: Adam on the decoder, a linear warm-up, then half a cosine to 0.
    optimizer = torch.optim.Adam(model.decoder.parameters(), lr=config.train.lr)
    total_steps = config.train.epochs * len(loader)
    warmup = min(config.train.warmup_steps, max(1, total_steps // 4))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: cosine_factor(step, warmup, total_steps)
    )
    # The decoder's objective: cross_entropy (equation 14), hard_attention (equation 12, REINFORCE).
    objective = objective_of(model.decoder)

    best = -math.inf
    for epoch in range(1, config.train.epochs + 1):
        model.train()
        model.encoder.eval()  # frozen: its batch norms keep their ImageNet statistics
        total, batches = 0.0, 0
        extra: float | None = None  # the objective's terms beyond the cross-entropy, when it has any
        for batch in loader:
            if batch is None:  # every image of the batch was unreadable and skipped
                continue
            batch = {key: value.to(device) for key, value in batch.items()}
            captions, lengths, image_index = flatten_captions(batch)  # (N, L), (N,), (N,)
            output = model(annotations_of(model, batch), captions, lengths, image_index)
            loss = objective(model.decoder, output, captions, config.model.decoder, config.train, None)
            optimizer.zero_grad(set_to_none=True)
            loss.total.backward()
            if config.train.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.decoder.parameters(), config.train.grad_clip)
            optimizer.step()
            schedule.step()
            total, batches = total + float(loss.cross_entropy.detach()), batches + 1
            if loss.hard_attention is not None:  # equation 12's REINFORCE and entropy terms
                extra = (extra or 0.0) + float(loss.hard_attention)

        model.eval()
        cider = validation_cider(model, config, val, device, output_dir, progress)
        hard = f"  REINFORCE and entropy {extra / max(batches, 1):.4f}" if extra is not None else ""
        print(f"epoch {epoch}: cross-entropy {total / max(batches, 1):.3f}{hard}  val CIDEr-D {cider:.3f}")
        if cider > best:  # keep the best epoch's weights, as the main job's best.pt
            best = cider
            save_checkpoint(
                checkpoint,
                config=config,
                vocab=vocab,
                decoder_state=model.decoder.state_dict(),
                encoder_fingerprint=model.encoder.fingerprint(),
            )
    print(f"wrote {checkpoint} (best val CIDEr-D {best:.3f}); captioning.load reads it")
    return checkpoint


if __name__ == "__main__":
    sys.exit(run_cli(main, get_args_parser()))
