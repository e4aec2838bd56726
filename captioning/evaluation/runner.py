"""Decode a split or a folder with a trained checkpoint, write COCO-format results, score them."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from captioning.config import Config, DecodeConfig
from captioning.data import load_records
from captioning.data.datasets import ImageOnlyDataset, collate_captions, usable_workers
from captioning.data.records import DatasetError, ImageRecord, records_of_split
from captioning.data.shapes import shapes_files
from captioning.decoding import Caption, check_decoding_fits
from captioning.evaluation.chair_table import chair_table
from captioning.evaluation.grounding import (
    Instances,
    WordMatcher,
    grounding_per_image,
    image_grounding_json,
    load_instances,
)
from captioning.evaluation.hallucination import add_chair, chair_line
from captioning.evaluation.java import DEFAULT_TIMEOUT_S
from captioning.evaluation.metrics import EvaluationInputError, score_captions
from captioning.evaluation.signature import make_signature, parse_signature, reward_description
from captioning.files import atomic_write, writes_in_place
from captioning.models.captioner import Captioner
from captioning.runtime.checkpoint import (
    CheckpointError,
    checkpoint_config,
    load_checkpoint,
    load_state_checked,
)
from captioning.runtime.inference import EpochBatches, generate_captions
from captioning.runtime.inputs import caption_dataset, check_splits, data_source, uses_cache
from captioning.text import detokenize

if TYPE_CHECKING:
    from captioning.evaluation.clip_score import ClipScorer


@dataclass
class Captioned:
    """One decoded image."""

    record: ImageRecord
    caption: Caption
    words: list[str] = field(default_factory=list)


def load_captioner(checkpoint: str | Path, device: torch.device) -> tuple[Captioner, Config]:
    """Rebuild the model a checkpoint file (weights_only loading) or a model folder (``save_pretrained``,
    safetensors) describes, on ``device`` in eval mode."""
    model, config, _ = load_trained_captioner(checkpoint, device)
    return model, config


def load_trained_captioner(
    checkpoint: str | Path, device: torch.device
) -> tuple[Captioner, Config, str | None]:
    """:func:`load_captioner`, and the self-critical reward its weights were tuned with
    (:func:`captioning.evaluation.signature.reward_description`; None after cross-entropy only)."""
    from captioning.pretrained import is_model_folder, load_folder

    payload = load_folder(checkpoint) if is_model_folder(checkpoint) else load_checkpoint(checkpoint)
    config, vocab = checkpoint_config(payload, checkpoint)
    model = Captioner.build(config.model, vocab)
    input_weight = payload["decoder"].get(model.decoder.input_weight)
    if (
        input_weight is not None
        and input_weight.dim() == 2
        and model.encoder.channels != input_weight.shape[1]
    ):
        raise CheckpointError(
            f"{checkpoint}: decoder expects {input_weight.shape[1]} channels "
            f"but encoder {model.encoder.name} gives {model.encoder.channels}"
        )
    load_state_checked(model.decoder, payload["decoder"], "decoder", checkpoint)
    if payload.get("encoder") is not None:
        load_state_checked(model.encoder, payload["encoder"], "encoder", checkpoint)
    trained = (payload.get("encoder_fingerprint") or {}).get("weights")
    now = model.encoder.fingerprint()["weights"]
    if trained is not None and trained != now:  # other features than the decoder learned from
        raise CheckpointError(
            f"{checkpoint}: the encoder weights differ from those it was trained with "
            f"({json.dumps(trained, sort_keys=True)} then, {json.dumps(now, sort_keys=True)} now)"
        )
    state = (payload.get("training") or {}).get("state") or {}
    reward = reward_description(config.train) if state.get("stage") == "scst" else None
    return model.to(device).eval(), config, reward


def caption_records(
    model: Captioner,
    config: Config,
    records: list[ImageRecord],
    device: torch.device,
    decode_config: DecodeConfig | None = None,
    progress: bool = True,
    output_dir: Path | None = None,
    build_cache: bool = True,
    pictures: Sequence[Image.Image] | None = None,
) -> list[Captioned]:
    """Caption ``records`` (from the feature cache when the encoder is frozen and they have captions).

    ``build_cache`` False: only an existing complete cache is used; nothing is written.
    ``pictures``: the records' RGB images already in memory (one per record), used instead of
    their files (the Python API and the demo; ``evaluate.py --images`` reads the same files).
    """
    decode_config = decode_config or config.decode
    check_decoding_fits(decode_config, len(model.vocab), model.grid[0] * model.grid[1], len(records), device)
    config = Config(config.data, config.model, config.train, decode_config)
    batches = EpochBatches(len(records), decode_config.batch_size, seed=0, epoch=0, shuffle=False)
    dataset: Dataset
    if pictures is None and all(r.captions for r in records) and uses_cache(config):
        dataset = caption_dataset(
            records, model, config, device, output_dir or Path("."), progress, 1, build_cache=build_cache
        )
    else:
        dataset = ImageOnlyDataset(records, model.encoder.transform, config.data.skip_bad_images, pictures)
    loader = DataLoader(
        dataset,
        batch_sampler=batches,
        collate_fn=collate_captions,
        num_workers=usable_workers(config.data.num_workers),
    )
    triples = generate_captions(model, loader, decode_config, device, progress=progress)
    return [Captioned(records[i], caption, caption.words(model.vocab)) for i, _, caption in triples]


def write_results(path: str | Path, captioned: list[Captioned]) -> Path:
    """COCO results format ``[{"image_id": ..., "caption": ...}]``, written atomically."""
    results = [{"image_id": item.record.image_id, "caption": detokenize(item.words)} for item in captioned]
    text = json.dumps(results, indent=1, ensure_ascii=False)
    atomic_write(path, lambda p: p.write_text(text, encoding="utf-8", errors="replace"))
    return Path(path)


def default_instances(config: Config) -> tuple[Path, ...]:
    """The instances files grounding uses by default: the configured ones, or Shapes' own."""
    if config.data.instances:
        return tuple(Path(path) for path in config.data.instances)
    if config.data.dataset == "shapes":
        return (shapes_files(config.data.root).instances,)
    return ()


def load_boxes(paths: Sequence[str | Path]) -> Instances | None:
    """The boxes of several COCO instances files (``instances_train2014.json``, ``instances_val2014.json``)
    as one :class:`Instances` (with every file's categories); None when there are no files.

    Raises:
        EvaluationInputError: a file is missing or malformed, or an image id is in two files.
    """
    if not paths:
        return None
    merged = Instances({}, {})
    source: dict[int, Path] = {}
    categories: dict[str, None] = {}  # ordered union: the first file's order, then new names
    for path in map(Path, paths):
        boxes = load_instances(path)
        for image_id in boxes.image_sizes:
            if image_id in source:
                raise EvaluationInputError(f"{path}: image {image_id}: also in {source[image_id]}")
            source[image_id] = path
        merged.image_sizes.update(boxes.image_sizes)
        merged.objects.update(boxes.objects)
        categories.update(dict.fromkeys(boxes.categories))
    merged.categories = tuple(categories)
    return merged


def add_boxed_scores(
    result: dict,
    boxes: Instances,
    words: Mapping[int, Sequence[str]],
    references: Mapping[int, Sequence[str]],
    attention: Mapping[int, tuple] | None = None,
    chair: str = "released",
) -> None:
    """Add attention grounding (when ``attention`` is given) and CHAIR to ``result`` in place, over the
    images ``boxes`` cover; ``grounding-images`` and ``CHAIR-images`` count them (the others are left
    out of these two only). Each covered image's ``per_image`` entry gets its own grounding fields
    (``grounding-words``, ``grounding-mass``, ``grounding-pointing``) and CHAIR fields.

    Args:
        result: the scores being built (with its ``per_image`` list).
        boxes: the annotated objects (:func:`load_boxes`).
        words: image id -> the generated caption's tokens.
        references: image id -> raw reference captions.
        attention: image id -> (attention maps (T, P), grid) of the generated caption.
        chair: CHAIR's word table (:data:`captioning.config.CHAIR_TABLES`); grounding always reads
            captions with the extended one.
    """
    covered = [image_id for image_id in words if image_id in boxes.image_sizes]
    matcher = WordMatcher()
    if attention is not None:
        items = [(image_id, words[image_id], *attention[image_id]) for image_id in covered]
        per_image = grounding_per_image(items, boxes, matcher)
        result.update(
            image_grounding_json(
                [m for masses, _ in per_image.values() for m in masses],
                [h for _, hits in per_image.values() for h in hits],
            )
        )
        result["grounding-images"] = len(covered)
        if "per_image" in result:
            result["per_image"] = [
                {**entry, **image_grounding_json(*per_image[entry["image_id"]])}
                if entry.get("image_id") in per_image
                else entry
                for entry in result["per_image"]
            ]
    add_chair(
        result, {image_id: words[image_id] for image_id in covered}, references, boxes, chair_table(chair)
    )
    result["CHAIR-images"] = len(covered)


def score_captioned(
    captioned: list[Captioned],
    grid: tuple[int, int],
    boxes: Instances | None = None,
    use_java: bool | None = None,
    spice: bool = False,
    java_timeout: float = DEFAULT_TIMEOUT_S,
    decode: DecodeConfig | None = None,
    checkpoint: Path | None = None,
    chair: str = "released",
    reward: str | None = None,
    clip_scorer: ClipScorer | None = None,
    tokenizer: str = "ptb",
) -> dict:
    """Caption metrics against each record's references, plus attention grounding and CHAIR (with the
    word table ``chair``) on the images ``boxes`` cover (``grounding-images`` and ``CHAIR-images`` of
    them; the others are left out of these only), CLIP-S and RefCLIP-S with ``clip_scorer`` (also per
    image), and the signature of the scores (``decode``, ``checkpoint`` and its self-critical
    ``reward`` describe the system). ``tokenizer``: the checkpoint's ``data.tokenizer``, which the
    metrics tokenize with."""
    references = {item.record.image_id: list(item.record.raw) for item in captioned}
    candidates = {item.record.image_id: detokenize(item.words) for item in captioned}
    scores = score_captions(
        references, candidates, use_java=use_java, spice=spice, java_timeout=java_timeout, tokenizer=tokenizer
    )
    result = scores.to_json()
    result["per_image"] = scores.per_image_json()
    result["table"] = scores.table()
    if boxes is not None:
        add_boxed_scores(
            result,
            boxes,
            {item.record.image_id: item.words for item in captioned},
            references,
            {item.record.image_id: (item.caption.attention.numpy(), grid) for item in captioned},
            chair,
        )
    if clip_scorer is not None:
        from captioning.evaluation.clip_score import clip_scores

        clip = clip_scores(
            clip_scorer,
            {item.record.image_id: item.record.path for item in captioned},
            candidates,
            references,
        )
        result["CLIP-S"], result["RefCLIP-S"] = clip["CLIP-S"], clip["RefCLIP-S"]
        for entry in result["per_image"]:
            entry.update(clip["per_image"][entry["image_id"]])
    result["signature"] = make_signature(
        references,
        scores.tokenizer,
        decode,
        checkpoint,
        chair=chair if boxes is not None else None,
        reward=reward,
        clip=clip_scorer.description if clip_scorer is not None else None,
        boxes=boxes,
        table=chair_table(chair) if boxes is not None else None,
    )
    return result


def clip_line(scores: Mapping[str, Any]) -> str | None:
    """The summary line of CLIP-S and RefCLIP-S (None when they were not computed)."""
    if scores.get("CLIP-S") is None:
        return None
    return (
        f"CLIP-S {scores['CLIP-S']:.4f}, RefCLIP-S {scores['RefCLIP-S']:.4f} "
        f"(Hessel et al. 2021: CLIP {parse_signature(scores['signature']).get('clip', '?')})"
    )


def grounding_line(scores: Mapping[str, Any], images: int) -> str | None:
    """The one summary line of attention grounding (None when it was not measured), rounded."""
    if "grounding-images" not in scores:
        return None
    covered = scores["grounding-images"]
    if not covered:
        return f"grounding: none of the {images} images has boxes in the instances files"
    if not scores["grounding-words"]:
        return (
            "grounding: no generated word names an annotated object "
            f"({covered} of {images} images with boxes)"
        )
    return (
        f"grounding: attention mass in the named object's box {scores['grounding-mass']:.3f}, pointing game "
        f"{scores['grounding-pointing']:.3f}, over {scores['grounding-words']} object words in {covered} of "
        f"{images} images with boxes"
    )


def summary_lines(scores: Mapping[str, Any], images: int) -> list[str]:
    """The lines printed under the scores table: grounding and CHAIR when measured, the signature last."""
    lines = [
        line
        for line in (grounding_line(scores, images), chair_line(scores), clip_line(scores))
        if line is not None
    ]
    return [*lines, f"signature: {scores['signature']}"]


def split_records(config: Config, split: str, generate: bool = True) -> list[ImageRecord]:
    """The records of one split of the configured dataset (``generate``: as for ``load_records``)."""
    records = load_records(config.data, generate=generate, splits=(split,))
    check_splits(records, config.data.dataset, [split], data_source(config.data))
    return records_of_split(records, split)


def write_scores(path: str | Path, scores: dict) -> tuple[Path, Path | None]:
    """``<name>.json`` with the overall numbers and ``<name>.per_image.json`` beside it (none beside a
    device or a FIFO: see ``per_image_path``)."""
    path = Path(path)
    per_image = per_image_path(path)
    overall = {k: v for k, v in scores.items() if k not in ("per_image", "table")}
    atomic_write(path, lambda p: p.write_text(json.dumps(overall, indent=2), encoding="utf-8"))
    if per_image is not None:
        atomic_write(
            per_image, lambda p: p.write_text(json.dumps(scores.get("per_image", [])), encoding="utf-8")
        )
    return path, per_image


def per_image_path(scores_path: str | Path) -> Path | None:
    """``x_scores.json`` -> ``x_scores.per_image.json``: where ``write_scores`` puts per-image scores;
    None when the scores go into a device, a FIFO or a shell's descriptor (``/dev/null``, ``/dev/stdout``),
    whose folder is no place for a second file."""
    scores_path = Path(scores_path)
    if writes_in_place(scores_path):
        return None
    return scores_path.with_name(scores_path.stem + ".per_image.json")


def decode_config_with(config: Config, **changes) -> DecodeConfig:
    """The checkpoint's decoding options with the non-None ``changes`` applied (validated)."""
    from dataclasses import asdict

    values = asdict(config.decode)
    values.update({k: v for k, v in changes.items() if v is not None})
    return DecodeConfig(**values)


def score_results_file(
    annotations: str | Path,
    results: str | Path,
    use_java: bool | None = None,
    spice: bool = False,
    java_timeout: float = DEFAULT_TIMEOUT_S,
    boxes: Instances | None = None,
    chair: str = "released",
    tokenizer: str = "ptb",
) -> dict:
    """Score a COCO results file against COCO-format reference captions, as the official toolkit does
    (``tokenizer``: as for :func:`score_captions`), with CHAIR (word table ``chair``) on the images
    ``boxes`` cover (:func:`load_boxes`) when given."""
    from captioning.evaluation.coco_files import load_coco_references, load_results
    from captioning.text import tokenize

    references = load_coco_references(annotations)
    candidates = load_results(results)
    missing = sorted(set(candidates) - set(references))
    if missing:
        raise DatasetError(f"{results}: image_id {missing[0]} has no reference captions in {annotations}")
    references = {image_id: references[image_id] for image_id in candidates}
    scores = score_captions(
        references, candidates, use_java=use_java, spice=spice, java_timeout=java_timeout, tokenizer=tokenizer
    )
    result = {**scores.to_json(), "per_image": scores.per_image_json(), "table": scores.table()}
    if boxes is not None:
        add_boxed_scores(
            result,
            boxes,
            {i: tokenize(caption) for i, caption in candidates.items()},
            references,
            chair=chair,
        )
    result["signature"] = make_signature(
        references,
        scores.tokenizer,
        results=results,
        chair=chair if boxes is not None else None,
        boxes=boxes,
        table=chair_table(chair) if boxes is not None else None,
    )
    return result
