"""``train.py --cache-only``: the frozen encoder run once over every split, its grids stored."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch

from captioning.config import Config
from captioning.data import build_vocabulary, load_records, reader_of, write_data_summary
from captioning.data.feature_cache import FeatureCache
from captioning.data.record_index import records_dir
from captioning.data.records import records_of_split
from captioning.inference.inputs import caption_dataset, feature_cache_dir, uses_cache
from captioning.models.captioner import Captioner, build_decoder
from captioning.models.encoders import build_encoder
from captioning.training.cpu_threads import say_if_busy
from captioning.training.plan import check_images_exist, describe_cache_plan
from captioning.utils import distributed
from captioning.utils.device import resolve_device, seed_everything
from captioning.utils.errors import RunError
from captioning.utils.output_paths import check_output_folder
from captioning.utils.run_folder import RunLock


def cache_features(config: Config, progress: bool = True) -> tuple[dict[str, Path], RunLock]:
    """Run the frozen encoder once over every split and store the grids (``train.py --cache-only``).

    It writes ``data_summary.json`` in ``train.output_dir`` and may build the feature cache there
    (``folder`` datasets), so it holds the run folder's lock as a training run does: it is refused
    while a run uses the folder, and a run is refused while it caches.

    It prints its plan (``describe_cache_plan``) once the inputs are checked, and says which splits'
    features were already cached.

    Returns:
        Every file or folder written, by what it is, and the held lock (``cache_only`` drops it).
    """
    if not uses_cache(config):
        raise ValueError("features are cached only for a frozen encoder with data.use_cache true")
    device = resolve_device(config.train.device)
    group = distributed.init_from_environment(device.type)  # under torchrun every rank encodes its share
    if device.type == "cuda" and group.world_size > 1:
        device = torch.device("cuda", group.local_rank)
        torch.cuda.set_device(device)
    output_dir = Path(config.train.output_dir)
    if group.is_main:
        check_output_folder(output_dir, "train.output_dir")
        RunLock(output_dir).check_free()
        say_if_busy(device)
    else:  # rank 0 reads (or generates) the data and claims the folder first
        distributed.barrier()
    # As a training run's rank 0 is seeded before it builds the model: random encoder weights
    # (model.encoder.weights=none) then match the run's, and so does the cache folder they key.
    seed_everything(config.train.seed, config.train.deterministic)
    encoder = build_encoder(config.model.encoder)  # before the data: a missing weights file stops here
    records = load_records(config.data, write_index=group.is_main)
    check_images_exist(records, config.data.skip_bad_images)
    vocab = build_vocabulary(records_of_split(records, "train") or records, config.data.min_word_count)
    decoder = build_decoder(config.model.decoder, len(vocab), encoder.channels, encoder.grid)
    model = Captioner(encoder, decoder, vocab, config.model).to(device)
    by_split = {
        split: [r for r in records_of_split(records, split) if r.captions]
        for split in ("train", "val", "test")
    }
    if group.is_main:
        print(
            describe_cache_plan(
                Counter({split: len(items) for split, items in by_split.items()}),
                model.encoder.name,
                model.encoder.grid,
                model.encoder.channels,
                feature_cache_dir(config, output_dir),
            ),
            flush=True,
        )
    lock = RunLock(output_dir)
    try:  # caching that fails lets go of the folder, as a failed run does
        written: dict[str, Path] = {}
        if group.is_main:
            output_dir.mkdir(parents=True, exist_ok=True)  # every input is checked: the folder may be claimed
            lock = lock.acquire()
            written["data summary"] = write_data_summary(records, config.data, output_dir)
            index = records_dir(config.data)
            if reader_of(config.data).indexed and index.is_dir():
                written["dataset index"] = index
            distributed.barrier()  # the data are read and the folder is claimed: the other ranks go on
        for split, split_records in by_split.items():
            if split_records:
                features = caption_dataset(
                    split_records, model, config, device, output_dir, progress and group.is_main, 1, group
                ).features
                if not isinstance(features, FeatureCache):  # uses_cache holds: caption_dataset builds one
                    raise RunError(f"{split} features: no feature cache was built in {output_dir}")
                computed = int(distributed.all_reduce_sum(torch.tensor(features.computed)))
                if computed:
                    written[f"{split} features"] = Path(features.path)
                elif group.is_main:  # an existing cache is not listed as written
                    print(
                        f"{split} features: already cached in {features.path}, nothing computed", flush=True
                    )
    except BaseException:
        lock.release()
        raise
    return written, lock
