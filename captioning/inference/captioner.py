"""Loading a trained captioner and captioning records with it: what the Python API, ``evaluate.py``,
``visualize.py``, the main job's test split and the demo share.

``load_captioner`` rebuilds the model a checkpoint or a model folder describes; ``caption_records``
captions a list of records in batches (from the feature cache when it can, else from the images).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from captioning.config import Config, DecodeConfig, reward_description
from captioning.config.loading import decode_config_with as decode_config_with  # where the tools find it
from captioning.data import data_source, load_records
from captioning.data.cache_build import cache_batch_size
from captioning.data.datasets import ImageOnlyDataset, collate_captions, usable_workers
from captioning.data.records import ImageRecord, records_of_split
from captioning.data.tokenizers import detokenize
from captioning.hub.checkpoint import (
    CheckpointError,
    check_state_fits,
    checkpoint_config,
    load_checkpoint,
    load_state_checked,
)
from captioning.inference.batches import EpochBatches, generate_captions
from captioning.inference.inputs import caption_dataset, check_splits, uses_cache
from captioning.models.captioner import Captioner, build_decoder
from captioning.models.decoding import Caption
from captioning.models.encoders import build_encoder
from captioning.models.encoders.activations import check_encoder_fits
from captioning.models.memory_bounds import check_decoder_fits, check_decoding_fits
from captioning.utils.text import printable


@dataclass
class Captioned:
    """One decoded image: its words, and ``text``, the caption as written (the words joined as the
    configured tokenizer's language writes them: without spaces for ``jieba`` and ``mecab``);
    with ``decode.num_return`` n > 1, ``alternatives`` holds its next n - 1 captions, ranked."""

    record: ImageRecord
    caption: Caption
    words: list[str] = field(default_factory=list)
    text: str = ""
    alternatives: list[Captioned] = field(default_factory=list)

    @property
    def ranked(self) -> list[Captioned]:
        """This caption and its ``alternatives``, best first."""
        return [self, *self.alternatives]

    def __post_init__(self) -> None:
        if not self.text:
            self.text = " ".join(self.words)


def fewer_captions_warning(captioned: Sequence[Captioned], asked: int) -> str | None:
    """One warning line when some images got fewer than the ``asked`` captions (``decode.num_return``),
    else None: sampling keeps distinct draws only (it draws again a few times, then gives what it
    has), and diverse beam search's groups may end on the same captions."""
    short = [item for item in captioned if len(item.ranked) < asked]
    if asked <= 1 or not short:
        return None
    least = min(short, key=lambda item: len(item.ranked))
    return printable(
        f"warning: {len(short)} of {len(captioned)} images have fewer than the {asked} captions asked for "
        f"(decode.num_return), e.g. {Path(least.record.path).name} has {len(least.ranked)}: the search "
        "found no more distinct ones (sampling drew the same captions again, or beam groups shared them)"
    )


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
    from captioning.hub.identity import is_model_folder
    from captioning.hub.model_folder import load_folder

    payload = load_folder(checkpoint) if is_model_folder(checkpoint) else load_checkpoint(checkpoint)
    config, vocab = checkpoint_config(payload, checkpoint)
    encoder = build_encoder(config.model.encoder)
    # its parameters priced before they are built (meta shapes of a huge layer count take long too)
    check_decoder_fits(config.model.decoder, len(vocab), encoder.channels, encoder.grid, device)
    with torch.device("meta"):  # the decoder's shapes, checked against the weights before building it
        shapes = build_decoder(config.model.decoder, len(vocab), encoder.channels, encoder.grid)
    input_weight = payload["decoder"].get(shapes.input_weight)
    if input_weight is not None and input_weight.dim() == 2 and encoder.channels != input_weight.shape[1]:
        raise CheckpointError(
            f"{checkpoint}: decoder expects {input_weight.shape[1]} channels "
            f"but encoder {encoder.name} gives {encoder.channels}"
        )
    check_state_fits(shapes, payload["decoder"], "decoder", checkpoint)
    decoder = build_decoder(config.model.decoder, len(vocab), encoder.channels, encoder.grid)
    model = Captioner(encoder, decoder, vocab, config.model)
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
    stage = state.get("stage") or payload.get("stage")  # a model folder stores the stage alone
    reward = reward_description(config.train) if stage == "scst" else None
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
    positions = model.grid[0] * model.grid[1]
    channels = model.decoder.annotation_dim
    check_decoding_fits(decode_config, len(model.vocab), positions, len(records), device, channels)
    config = Config(config.data, config.model, config.train, decode_config)
    batches = EpochBatches(len(records), decode_config.batch_size, seed=0, epoch=0, shuffle=False)
    dataset: Dataset
    # The encoder runs over the feature cache's batches, else over the decoding's: both bounded first.
    if pictures is None and all(r.captions for r in records) and uses_cache(config):
        check_encoder_fits(model.encoder, cache_batch_size(device), device, None)
        dataset = caption_dataset(
            records, model, config, device, output_dir or Path("."), progress, 1, build_cache=build_cache
        )
    else:
        images = min(decode_config.batch_size, max(len(records), 1))
        check_encoder_fits(model.encoder, images, device, "decode.batch_size")
        dataset = ImageOnlyDataset(records, model.encoder.transform, config.data.skip_bad_images, pictures)
    loader = DataLoader(
        dataset,
        batch_sampler=batches,
        collate_fn=collate_captions,
        num_workers=usable_workers(config.data.num_workers),
    )
    triples = generate_captions(model, loader, decode_config, device, progress=progress)

    def captioned(record: ImageRecord, caption: Caption) -> Captioned:
        words = caption.words(model.vocab)
        others = [captioned(record, other) for other in caption.alternatives]
        return Captioned(record, caption, words, detokenize(words, config.data.tokenizer), others)

    return [captioned(records[i], caption) for i, _, caption in triples]


def split_records(config: Config, split: str, generate: bool = True) -> list[ImageRecord]:
    """The records of one split of the configured dataset (``generate``: as for ``load_records``)."""
    records = load_records(config.data, generate=generate, splits=(split,))
    check_splits(records, config.data.dataset, [split], data_source(config.data))
    return records_of_split(records, split)
