"""Decode a split or a folder with a trained checkpoint, write COCO-format results, score them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from captioning.config import Config, DecodeConfig
from captioning.data import load_records
from captioning.data.datasets import ImageOnlyDataset, collate_captions
from captioning.data.records import DatasetError, ImageRecord, records_of_split
from captioning.data.shapes import shapes_files
from captioning.decoding import Caption
from captioning.evaluation.grounding import WordMatcher, grounding_scores, load_instances
from captioning.evaluation.hallucination import add_chair
from captioning.evaluation.metrics import score_captions
from captioning.evaluation.signature import make_signature
from captioning.models.captioner import Captioner
from captioning.training.checkpoint import (
    CheckpointError,
    atomic_write,
    checkpoint_config,
    load_checkpoint,
    load_state_checked,
)
from captioning.training.engine import EpochBatches, generate_captions
from captioning.training.run import caption_dataset, uses_cache


@dataclass
class Captioned:
    """One decoded image."""

    record: ImageRecord
    caption: Caption
    words: list[str] = field(default_factory=list)


def load_captioner(checkpoint: str | Path, device: torch.device) -> tuple[Captioner, Config]:
    """Rebuild the model a checkpoint describes (weights_only loading) and put it in eval mode."""
    payload = load_checkpoint(checkpoint)
    config, vocab = checkpoint_config(payload, checkpoint)
    model = Captioner.build(config.model, vocab)
    if model.encoder.channels != payload["decoder"]["init_h.weight"].shape[1]:
        raise ValueError(f"{checkpoint}: decoder expects {payload['decoder']['init_h.weight'].shape[1]} channels "
                         f"but encoder {model.encoder.name} gives {model.encoder.channels}")
    load_state_checked(model.decoder, payload["decoder"], "decoder", checkpoint)
    if payload.get("encoder") is not None:
        load_state_checked(model.encoder, payload["encoder"], "encoder", checkpoint)
    trained = (payload.get("encoder_fingerprint") or {}).get("weights")
    now = model.encoder.fingerprint()["weights"]
    if trained is not None and trained != now:  # other features than the decoder learned from
        raise CheckpointError(f"{checkpoint}: the encoder weights differ from those it was trained with "
                              f"({json.dumps(trained, sort_keys=True)} then, {json.dumps(now, sort_keys=True)} now)")
    return model.to(device).eval(), config


def caption_records(model: Captioner, config: Config, records: list[ImageRecord], device: torch.device,
                    decode_config: DecodeConfig | None = None, progress: bool = True,
                    output_dir: Path | None = None) -> list[Captioned]:
    """Caption ``records`` (from the feature cache when the encoder is frozen and they have captions)."""
    decode_config = decode_config or config.decode
    config = Config(config.data, config.model, config.train, decode_config)
    batches = EpochBatches(len(records), decode_config.batch_size, seed=0, epoch=0, shuffle=False)
    if all(r.captions for r in records) and uses_cache(config):
        dataset = caption_dataset(records, model, config, device, output_dir or Path("."), progress, 1)
    else:
        dataset = ImageOnlyDataset(records, model.encoder.transform, config.data.skip_bad_images)
    loader = DataLoader(dataset, batch_sampler=batches, collate_fn=collate_captions,
                        num_workers=config.data.num_workers)
    triples = generate_captions(model, loader, decode_config, device, progress=progress)
    return [Captioned(records[i], caption, caption.words(model.vocab)) for i, _, caption in triples]


def write_results(path: str | Path, captioned: list[Captioned]) -> Path:
    """COCO results format ``[{"image_id": ..., "caption": ...}]``, written atomically."""
    results = [{"image_id": item.record.image_id, "caption": " ".join(item.words)} for item in captioned]
    atomic_write(path, lambda p: p.write_text(json.dumps(results, indent=1, ensure_ascii=False), encoding="utf-8"))
    return Path(path)


def default_instances(config: Config) -> Path | None:
    """The instances file grounding uses by default: the configured one, or Shapes' own."""
    if config.data.instances:
        return Path(config.data.instances)
    if config.data.dataset == "shapes":
        return shapes_files(config.data.root).instances
    return None


def score_captioned(captioned: list[Captioned], grid: tuple[int, int], instances: Path | None = None,
                    use_java: bool | None = None, spice: bool = False, decode: DecodeConfig | None = None,
                    checkpoint: Path | None = None) -> dict:
    """Caption metrics against each record's references, plus attention grounding and CHAIR when boxes
    are given, and the signature of the scores (``decode`` and ``checkpoint`` describe the system)."""
    references = {item.record.image_id: list(item.record.raw) for item in captioned}
    candidates = {item.record.image_id: " ".join(item.words) for item in captioned}
    scores = score_captions(references, candidates, use_java=use_java, spice=spice)
    result = scores.to_json()
    result["per_image"] = scores.per_image_json()
    result["table"] = scores.table()
    if instances is not None:
        boxes = load_instances(instances)
        items = [(item.record.image_id, item.words, item.caption.attention.numpy(), grid) for item in captioned]
        result.update(grounding_scores(items, boxes, WordMatcher()))
        add_chair(result, {item.record.image_id: item.words for item in captioned}, references, boxes)
    result["signature"] = make_signature(references, scores.tokenizer, decode, checkpoint)
    return result


def split_records(config: Config, split: str) -> list[ImageRecord]:
    """The records of one split of the configured dataset."""
    records = records_of_split(load_records(config.data), split)
    if not records:
        raise DatasetError(f"the {config.data.dataset} dataset has no images in split {split!r}")
    return records


def write_scores(path: str | Path, scores: dict) -> tuple[Path, Path]:
    """``<name>.json`` with the overall numbers and ``<name>.per_image.json`` beside it."""
    path = Path(path)
    per_image_path = path.with_name(path.stem + ".per_image.json")
    overall = {k: v for k, v in scores.items() if k not in ("per_image", "table")}
    atomic_write(path, lambda p: p.write_text(json.dumps(overall, indent=2), encoding="utf-8"))
    atomic_write(per_image_path, lambda p: p.write_text(json.dumps(scores.get("per_image", [])), encoding="utf-8"))
    return path, per_image_path



def decode_config_with(config: Config, **changes) -> DecodeConfig:
    """The checkpoint's decoding options with the non-None ``changes`` applied (validated)."""
    from dataclasses import asdict

    values = asdict(config.decode)
    values.update({k: v for k, v in changes.items() if v is not None})
    return DecodeConfig(**values)


def score_results_file(annotations: str | Path, results: str | Path, use_java: bool | None = None,
                       spice: bool = False, instances: Path | None = None) -> dict:
    """Score a COCO results file against COCO-format reference captions, as the official toolkit does
    (and CHAIR when an instances file is given)."""
    from captioning.evaluation.metrics import load_coco_references, load_results
    from captioning.text import tokenize

    references = load_coco_references(annotations)
    candidates = load_results(results)
    missing = sorted(set(candidates) - set(references))
    if missing:
        raise DatasetError(f"{results}: image_id {missing[0]} has no reference captions in {annotations}")
    references = {image_id: references[image_id] for image_id in candidates}
    boxes = load_instances(instances) if instances is not None else None
    scores = score_captions(references, candidates, use_java=use_java, spice=spice)
    result = {**scores.to_json(), "per_image": scores.per_image_json(), "table": scores.table()}
    if boxes is not None:
        add_chair(result, {i: tokenize(caption) for i, caption in candidates.items()}, references, boxes)
    result["signature"] = make_signature(references, scores.tokenizer, results=results)
    return result
