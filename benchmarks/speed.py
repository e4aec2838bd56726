"""Speed benchmark of the decoder, beam search and the feature cache, beside the tutorial's decoder.

    python benchmarks/speed.py                      # CPU, reference sizes, a table
    python benchmarks/speed.py --json               # one JSON object on stdout
    python benchmarks/speed.py --device cuda --amp  # GPU, bf16 autocast, plus the COCO epoch estimate
    python benchmarks/speed.py --parts train,beam   # parts: train, beam, cache, coco, transformer, loader,
                                                    # scst, caption
    python benchmarks/speed.py --quick --json       # tiny sizes, a few seconds (the test suite's run)

Every number is the median of ``--repeats`` timed runs after a warm-up run, in one process. See
benchmarks/README.md for what each number means and for results.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import json
import math
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

# Measure the code of this checkout (not another copy the environment may have installed), and
# find tutorial_baseline beside this file.
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import caption_speed
import loader_speed
import scst_speed
import transformer_speed
from harness import OtherLoad, PeakMemory, autocast, median_seconds, synchronize
from tutorial_baseline import TutorialDecoder, tutorial_beam_search, tutorial_loss

import captioning
from captioning.config import DecodeConfig, EncoderConfig, LSTMDecoderConfig
from captioning.data import build_vocabulary, generate_shapes, read_shapes
from captioning.data.datasets import CaptionDataset, collate_captions
from captioning.data.feature_cache import FeatureCache, cache_batch_size
from captioning.data.images import load_image
from captioning.data.records import records_of_split
from captioning.data.vocab import Vocabulary
from captioning.models.decoder import ShowAttendTellDecoder
from captioning.models.decoding import beam_search
from captioning.models.encoders import Encoder, build_encoder
from captioning.training.engine import flatten_captions
from captioning.training.losses import caption_loss
from captioning.training.optim import adam
from captioning.utils.device import bf16_cost, cpu_bf16_instructions

COCO_IMAGES = 113_287  # Karpathy train + restval
COCO_CAPTIONS = 566_747
CAPTIONS_PER_IMAGE = 5
# Words per COCO training caption (cut at 20, as data.max_caption_length does): an approximation,
# not counted from the annotations (not available here). Annotators were asked for 8+ words, the
# histogram peaks at 9-10 and has a long right tail; this table sums to 1 and has mean 10.49 words.
COCO_WORDS = {
    6: 0.005,
    7: 0.025,
    8: 0.14,
    9: 0.245,
    10: 0.2,
    11: 0.135,
    12: 0.085,
    13: 0.055,
    14: 0.035,
    15: 0.025,
    16: 0.017,
    17: 0.012,
    18: 0.008,
    19: 0.005,
    20: 0.008,
}


@dataclass(frozen=True)
class Sizes:
    """The benchmark configuration; the defaults are the reference (the tutorial's sizes)."""

    batch: int = 32  # captions per training step, one image each
    caption_tokens: int = 22  # <start> + 20 words + <end>: 21 decoding steps, every caption full length
    grid: int = 14  # grid side: P = 196 positions
    channels: int = 2048  # C, annotation channels (ResNet-101)
    attention_dim: int = 512
    embed_dim: int = 512
    hidden_dim: int = 512
    vocab_size: int = 9490
    dropout: float = 0.5
    beam_images: int = 16
    beam_max_length: int = 50
    beam_sizes: tuple[int, ...] = (1, 3, 5)
    tutorial_beam_images: int = 2  # the tutorial decodes one image at a time: its rate is per image
    matmul_size: int = 2048  # 8192 on CUDA
    shapes_images: int = 64
    shapes_image_size: int = 448  # Lite0's native grid is 14x14 at 448 px (7x7 at 224)
    shapes_grid: int = 14
    coco_steps: int = 20  # timed batches of the COCO epoch estimate

    @property
    def positions(self) -> int:
        return self.grid * self.grid


QUICK = Sizes(
    batch=4,
    caption_tokens=6,
    grid=3,
    channels=32,
    attention_dim=16,
    embed_dim=16,
    hidden_dim=16,
    vocab_size=50,
    beam_images=2,
    beam_max_length=5,
    tutorial_beam_images=1,
    matmul_size=128,
    shapes_images=4,
    shapes_image_size=64,
    shapes_grid=2,
    coco_steps=2,
)


def decoder_config(sizes: Sizes) -> LSTMDecoderConfig:
    """The tutorial's variant of our decoder: additive ReLU attention, channel gate, linear output."""
    return LSTMDecoderConfig(
        attention="soft",
        scoring="additive",
        activation="relu",
        gate="channel",
        deep_output=False,
        embed_dim=sizes.embed_dim,
        hidden_dim=sizes.hidden_dim,
        attention_dim=sizes.attention_dim,
        dropout=sizes.dropout,
        doubly_stochastic=1.0,
    )


# ------------------------------------------------------------------------------------ arithmetic
def train_step_flop(
    sizes: Sizes, num_images: int, num_tokens: int, per_step_projection: bool = False
) -> float:
    """FLOP of one teacher-forced training step, counted from the layer sizes (matrix products only).

    A multiply-add is 2 FLOP. Backward is counted as twice the forward (gradients with respect to
    the inputs and to the weights), so every forward product counts x3. Elementwise work (ReLU,
    softmax, LSTM non-linearities, Adam) is left out: it is small in FLOP though not in time.

    Args:
        num_images: B, grids projected once each (our decoder).
        num_tokens: sum over captions of the decoding steps (words + <end>), N * T when all are full.
        per_step_projection: the tutorial's count: the annotation projection is redone for every
            active caption at every step, i.e. ``num_tokens`` times instead of ``num_images`` times.
    """
    p, c, a = sizes.positions, sizes.channels, sizes.attention_dim
    m, h, v = sizes.embed_dim, sizes.hidden_dim, sizes.vocab_size
    projection = 2 * p * c * a  # W_a a_i for the P annotation vectors of one image
    per_image = 2 * 2 * c * h  # init_h and init_c of the mean annotation
    per_token = (
        2 * m * 4 * h  # embedding share of the LSTM gates
        + 2 * h * a  # attention query W_h h_{t-1}
        + 2 * p * a  # scores w^T relu(W_a a_i + W_h h) over the P positions
        + 2 * p * c  # context sum_i alpha_i a_i
        + 2 * h * c  # channel gate f_beta(h_{t-1})
        + 2 * (c + h) * 4 * h  # context and recurrent shares of the LSTM gates
        + 2 * h * v
    )  # output layer
    projections = num_tokens if per_step_projection else num_images
    forward = projections * projection + num_images * per_image + num_tokens * per_token
    return 3.0 * forward


# ------------------------------------------------------------------------------------ the parts
def matmul_peak(sizes: Sizes, device: torch.device, repeats: int, dtype: torch.dtype) -> tuple[float, float]:
    """GFLOP/s of an n x n x n matrix product in ``dtype`` (the ceiling), and its peak memory."""
    n = sizes.matmul_size
    left = torch.randn(n, n, device=device, dtype=dtype)
    right = torch.randn(n, n, device=device, dtype=dtype)
    with PeakMemory(device) as memory:
        seconds = median_seconds(lambda: torch.mm(left, right), max(repeats, 3), device)
    return 2 * n**3 / seconds / 1e9, memory.mib


def random_captions(
    sizes: Sizes,
    num_captions: int,
    words: Iterator[int] | None,
    device: torch.device,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, L) random captions <start> w.. <end> <pad>.. and their (N,) token counts (all full by default)."""
    lengths = [sizes.caption_tokens if words is None else next(words) + 2 for _ in range(num_captions)]
    captions = torch.randint(4, sizes.vocab_size, (num_captions, max(lengths)), generator=generator)
    for row, length in enumerate(lengths):
        captions[row, 0] = Vocabulary.start_id
        captions[row, length - 1] = Vocabulary.end_id
        captions[row, length:] = Vocabulary.pad_id
    return captions.to(device), torch.tensor(lengths, device=device)


def our_train_step(
    decoder: ShowAttendTellDecoder,
    optimizer: torch.optim.Optimizer,
    annotations: torch.Tensor,
    captions: torch.Tensor,
    lengths: torch.Tensor,
    image_index: torch.Tensor | None,
    device: torch.device,
    amp: bool,
) -> None:
    """Forward, cross-entropy + doubly stochastic penalty, backward, Adam step."""
    optimizer.zero_grad(set_to_none=True)
    with autocast(device, amp):
        output = decoder(annotations, captions, lengths, image_index)
        loss = caption_loss(output, captions, penalty_weight=1.0).total
    loss.backward()
    optimizer.step()


def tutorial_train_step(
    decoder: TutorialDecoder,
    optimizer: torch.optim.Optimizer,
    annotations: torch.Tensor,
    captions: torch.Tensor,
    lengths: torch.Tensor,
    device: torch.device,
    amp: bool,
) -> None:
    optimizer.zero_grad(set_to_none=True)
    with autocast(device, amp):
        logits, sorted_captions, decode_lengths, alphas, _ = decoder(annotations, captions, lengths)
        loss = tutorial_loss(logits, sorted_captions, decode_lengths, alphas)
    loss.backward()
    optimizer.step()


def training(
    sizes: Sizes,
    decoder: ShowAttendTellDecoder,
    tutorial: TutorialDecoder,
    device: torch.device,
    repeats: int,
    tutorial_repeats: int,
    amp: bool,
) -> dict[str, float]:
    """Milliseconds per training step of both decoders on the same batch (all captions full length)."""
    generator = torch.Generator().manual_seed(1)
    annotations = torch.rand(sizes.batch, sizes.positions, sizes.channels, generator=generator).to(device)
    captions, lengths = random_captions(sizes, sizes.batch, None, device, generator)
    results = {}
    decoder.train()

    def our_step_seconds(precision_amp: bool) -> tuple[float, float]:
        optimizer = adam(decoder.parameters(), lr=4e-4)
        with PeakMemory(device) as memory:
            seconds = median_seconds(
                functools.partial(
                    our_train_step,
                    decoder,
                    optimizer,
                    annotations,
                    captions,
                    lengths,
                    None,
                    device,
                    precision_amp,
                ),
                repeats,
                device,
            )
        return seconds, memory.mib

    seconds, results["train_peak_mem_mb"] = our_step_seconds(amp)
    results["train_step_ms"] = seconds * 1e3
    if amp:  # the float32 step beside it, in the same process and conditions
        seconds, results["train_peak_mem_mb_fp32"] = our_step_seconds(False)
        results["train_step_ms_fp32"] = seconds * 1e3
        results["amp_train_speedup"] = results["train_step_ms_fp32"] / results["train_step_ms"]
    tutorial.train()
    tutorial_optimizer = adam(tutorial.parameters(), lr=4e-4)
    with PeakMemory(device) as memory:
        seconds = median_seconds(
            functools.partial(
                tutorial_train_step, tutorial, tutorial_optimizer, annotations, captions, lengths, device, amp
            ),
            tutorial_repeats,
            device,
        )
    results["tutorial_train_step_ms"], results["tutorial_train_peak_mem_mb"] = seconds * 1e3, memory.mib
    del tutorial_optimizer
    tokens = int((lengths - 1).sum())
    results["train_step_gflop"] = train_step_flop(sizes, sizes.batch, tokens) / 1e9
    results["tutorial_train_step_gflop"] = train_step_flop(sizes, sizes.batch, tokens, True) / 1e9
    results["train_gflops"] = results["train_step_gflop"] / (results["train_step_ms"] / 1e3)
    if amp:
        results["train_gflops_fp32"] = results["train_step_gflop"] / (results["train_step_ms_fp32"] / 1e3)
    results["speedup_train"] = results["tutorial_train_step_ms"] / results["train_step_ms"]
    return results


def beam_decoding(
    sizes: Sizes,
    decoder: ShowAttendTellDecoder,
    device: torch.device,
    repeats: int,
    tutorial_repeats: int,
    amp: bool,
) -> dict[str, Any]:
    """Captions per second of batched beam search (all images at once) and of the tutorial's (one by one).

    Untrained weights rank words arbitrarily, and a search that happens to pick <end> early would
    time almost nothing; so both decoders get the same weights with <end> made unreachable
    (a -1e4 output bias), and every search runs the full ``beam_max_length`` words: the same work
    for both, the worst case of a real search.
    """
    generator = torch.Generator().manual_seed(2)
    grids = torch.rand(sizes.beam_images, sizes.positions, sizes.channels, generator=generator).to(device)
    decoder = copy.deepcopy(decoder).eval()
    with torch.no_grad():
        decoder.out.bias[Vocabulary.end_id] = -1e4
    tutorial = TutorialDecoder.from_ours(decoder).eval()
    ours, theirs, results = {}, {}, {}
    with PeakMemory(device) as our_memory:
        for k in sizes.beam_sizes:
            with autocast(device, amp):
                seconds = median_seconds(
                    functools.partial(
                        beam_search,
                        decoder,
                        grids,
                        DecodeConfig(beam_size=k, max_length=sizes.beam_max_length, forbid_unk=False),
                    ),
                    repeats,
                    device,
                )
            ours[str(k)] = sizes.beam_images / seconds
    few = grids[: sizes.tutorial_beam_images]

    def tutorial_images(k: int) -> None:
        for grid in few:
            tutorial_beam_search(
                tutorial, grid, k, Vocabulary.start_id, Vocabulary.end_id, sizes.beam_max_length
            )

    with PeakMemory(device) as tutorial_memory:
        for k in sizes.beam_sizes:
            with autocast(device, amp):
                seconds = median_seconds(functools.partial(tutorial_images, k), tutorial_repeats, device)
            theirs[str(k)] = len(few) / seconds
    results = {
        "beam_captions_per_s": ours,
        "tutorial_beam_captions_per_s": theirs,
        "beam_peak_mem_mb": our_memory.mib,
        "tutorial_beam_peak_mem_mb": tutorial_memory.mib,
    }
    for k in sizes.beam_sizes:
        results[f"speedup_beam_{k}"] = ours[str(k)] / theirs[str(k)]
    return results


def feature_cache(sizes: Sizes, device: torch.device, repeats: int, amp: bool) -> dict[str, float]:
    """One epoch of decoder training fed from the feature cache vs. from images through the encoder.

    Both read a Shapes train split with a DataLoader in the main process (batches of 32 images x 5
    captions) and run the same decoder training step (reference decoder sizes, the split's own
    vocabulary); the streamed epoch loads, transforms and encodes (frozen efficientnet_lite0) each
    image instead of reading its cached grid. The cache is built before timing. ``*_grids_s`` is the
    part of the epoch spent producing the (B, P, C) grids, the rest is the decoder steps.
    """
    with tempfile.TemporaryDirectory(prefix="speed_shapes_") as folder:
        files = generate_shapes(
            Path(folder) / "shapes",
            seed=0,
            num_train=sizes.shapes_images,
            num_val=1,
            num_test=1,
            image_size=sizes.shapes_image_size,
        )
        records = records_of_split(read_shapes(files.root), "train")
        vocab = build_vocabulary(records, min_count=1)
        encoder = build_encoder(
            EncoderConfig(
                name="efficientnet_lite0",
                weights="pretrained",
                image_size=sizes.shapes_image_size,
                grid_size=sizes.shapes_grid,
            )
        )
        encoder.to(device).eval()
        start = time.perf_counter()
        cache = FeatureCache.build_or_open(
            Path(folder) / "cache", encoder, records, device=device, progress=False
        )
        build_seconds = time.perf_counter() - start
        decoder = ShowAttendTellDecoder.from_config(decoder_config(sizes), len(vocab), encoder.channels).to(
            device
        )
        optimizer = adam(decoder.parameters(), lr=4e-4)

        def epoch(dataset: CaptionDataset) -> tuple[float, float]:
            """Seconds of the whole epoch and of producing its grids."""
            synchronize(device)
            start = time.perf_counter()
            grid_seconds = 0.0
            batches = iter(DataLoader(dataset, batch_size=32, shuffle=False, collate_fn=collate_captions))
            while True:
                grids_start = time.perf_counter()
                batch = next(batches, None)
                if batch is None:
                    break
                if "features" in batch:
                    annotations = batch["features"].to(device).float()  # (B, P, C)
                else:
                    with torch.no_grad(), autocast(device, amp):
                        annotations = encoder(batch["images"].to(device)).float()  # (B, P, C)
                synchronize(device)
                grid_seconds += time.perf_counter() - grids_start
                captions, lengths, image_index = flatten_captions(batch)
                our_train_step(
                    decoder,
                    optimizer,
                    annotations,
                    captions.to(device),
                    lengths.to(device),
                    image_index.to(device),
                    device,
                    amp,
                )
            synchronize(device)
            return time.perf_counter() - start, grid_seconds

        results = {"cache_build_s": build_seconds, **encoder_rates(encoder, records, device, repeats)}
        for name, dataset in (
            ("cache", CaptionDataset(records, vocab, 20, CAPTIONS_PER_IMAGE, features=cache)),
            ("stream", CaptionDataset(records, vocab, 20, CAPTIONS_PER_IMAGE, transform=encoder.transform)),
        ):
            with PeakMemory(device) as memory:
                epoch(dataset)  # warm-up
                runs = [epoch(dataset) for _ in range(repeats)]
            results[f"{name}_epoch_s"] = statistics.median(total for total, _ in runs)
            results[f"{name}_grids_s"] = statistics.median(grids for _, grids in runs)
            results[f"{name}_peak_mem_mb"] = memory.mib
        results["cache_speedup"] = results["stream_epoch_s"] / results["cache_epoch_s"]
        results["cache_grids_speedup"] = results["stream_grids_s"] / results["cache_grids_s"]
        return results


def encoder_rates(encoder: Encoder, records: list, device: torch.device, repeats: int) -> dict[str, float]:
    """Images per second through the frozen encoder as built and through ``inference_copy()`` (its
    batch norms folded into the convolutions, what the feature cache runs), on one batch of the size
    the cache encodes at a time (``cache_batch_size``) of the split's images."""
    batch = records[: cache_batch_size(device)]
    images = torch.stack([encoder.transform(load_image(record.path)) for record in batch]).to(device)
    rates = {}
    for name, network in (("encoder", encoder.eval()), ("folded_encoder", encoder.inference_copy())):
        with torch.inference_mode():
            seconds = median_seconds(lambda network=network: network(images), repeats, device)
        rates[f"{name}_images_per_s"] = len(images) / seconds
    rates["fold_speedup"] = rates["folded_encoder_images_per_s"] / rates["encoder_images_per_s"]
    return rates


def coco_words(generator: torch.Generator) -> Iterator[int]:
    """Caption lengths in words drawn from ``COCO_WORDS``."""
    words = list(COCO_WORDS)
    weights = torch.tensor([COCO_WORDS[w] for w in words])
    while True:
        yield words[int(torch.multinomial(weights, 1, generator=generator))]


def coco_epoch(
    sizes: Sizes, decoder: ShowAttendTellDecoder, device: torch.device, amp: bool
) -> dict[str, float]:
    """One cross-entropy epoch at COCO's size, from the mean time of ``coco_steps`` timed batches.

    A batch is 32 images' grids (held in memory) with 5 captions each, lengths drawn from
    ``COCO_WORDS``; the epoch is ceil(113,287 / 32) such batches.
    """
    generator = torch.Generator().manual_seed(3)
    images = 32
    annotations = torch.rand(images, sizes.positions, sizes.channels, generator=generator).to(device)
    image_index = torch.arange(images, device=device).repeat_interleave(CAPTIONS_PER_IMAGE)
    words = coco_words(generator)
    batches = [
        random_captions(sizes, images * CAPTIONS_PER_IMAGE, words, device, generator)
        for _ in range(sizes.coco_steps + 2)
    ]
    decoder.train()
    optimizer = adam(decoder.parameters(), lr=4e-4)
    times = []
    for number, (captions, lengths) in enumerate(batches):
        synchronize(device)
        start = time.perf_counter()
        our_train_step(decoder, optimizer, annotations, captions, lengths, image_index, device, amp)
        synchronize(device)
        if number >= 2:  # two warm-up batches
            times.append(time.perf_counter() - start)
    step = statistics.fmean(times)
    return {
        "coco_step_ms": step * 1e3,
        "coco_epoch_s": step * math.ceil(COCO_IMAGES / images),
        "coco_mean_words": sum(w * p for w, p in COCO_WORDS.items()) / sum(COCO_WORDS.values()),
    }


# ------------------------------------------------------------------------------------ the command
def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument(
        "--amp",
        action="store_true",
        help="bf16 autocast (CUDA or CPU); the float32 training step is timed beside it",
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per number (median)")
    parser.add_argument(
        "--tutorial-repeats",
        type=int,
        default=3,
        help="timed runs of the (slow) tutorial and of the Transformer's recomputing beam search",
    )
    parser.add_argument(
        "--threads", type=int, default=0, help="CPU threads (default: the usable cores; 1 with --quick)"
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the script runs, in seconds")
    parser.add_argument(
        "--parts",
        default="train,beam,cache",
        help="comma-separated parts to run: train, beam, cache, coco, transformer, loader, scst, "
        "caption (default "
        "train,beam,cache; coco is added on CUDA); the matmul peak always runs",
    )
    parser.add_argument("--coco", action="store_true", help="add the COCO epoch estimate to the parts")
    parser.add_argument(
        "--loader-dir",
        type=Path,
        default=None,
        help="loader part: the folder (disk) for its synthetic feature cache (default: the "
        "temporary folder); it is deleted afterwards",
    )
    parser.add_argument(
        "--loader-images",
        type=int,
        default=None,
        help=f"loader part: rows of the synthetic cache (default {loader_speed.COCO_IMAGES:,}, "
        "COCO's Karpathy train + restval)",
    )
    parser.add_argument(
        "--loader-grid",
        default=None,
        help="loader part: HxWxC of a row (default 7x7x1280, 14 GB for COCO; 14x14x2048 is 91 GB)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    return parser


def environment(device: torch.device, threads: int, amp: bool) -> dict[str, Any]:
    cpu = platform.processor() or "unknown"
    with contextlib.suppress(OSError):
        match = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
        cpu = match.group(1).strip() if match else cpu
    return {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu,
        "cpu": cpu,
        "threads": threads,
        "amp": amp,
        # bf16 on a CPU without bf16 instructions is an order of magnitude slower (bf16_cost)
        "cpu_capability": cpu_bf16_instructions()[0],
        "cpu_bf16_instructions": cpu_bf16_instructions()[1],
        "torch": torch.__version__,
        "captioning": str(Path(captioning.__file__).parent),
        "load_average_start": os.getloadavg()[0],
    }


def main(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark; the results as one flat dictionary (beam rates are keyed by beam size)."""
    with OtherLoad() as other:
        results = run_parts(args)
    results["load_average_end"] = os.getloadavg()[0]
    results["other_processes_cores"] = other.cores
    return results


def check_flags(args: argparse.Namespace) -> torch.device:
    """Refuse, in one line before anything is measured, a flag out of its bounds; returns the device.

    Threads are bounded by the cores this process may use: past that they only contend, and
    OpenMP crashes when asked for tens of thousands.
    """
    try:
        device = torch.device(args.device)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise SystemExit(f"--device: must be cpu, cuda or cuda:N, got {args.device!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available")
    cores = len(os.sched_getaffinity(0))
    if not 0 <= args.threads <= cores:
        raise SystemExit(
            f"--threads: must be between 0 (all usable cores) and the {cores} usable cores, "
            f"got {args.threads}"
        )
    for flag in ("repeats", "tutorial_repeats"):
        if getattr(args, flag) < 1:
            raise SystemExit(f"--{flag.replace('_', '-')}: must be at least 1, got {getattr(args, flag)}")
    return device


def run_parts(args: argparse.Namespace) -> dict[str, Any]:
    device = check_flags(args)
    # Tiny quick sizes gain nothing from threads, and on a busy machine idle threads spin.
    threads = args.threads or (1 if args.quick else len(os.sched_getaffinity(0)))
    torch.set_num_threads(threads)
    sizes = QUICK if args.quick else Sizes()
    if device.type == "cuda" and not args.quick:
        sizes = replace(sizes, matmul_size=8192)
    repeats, tutorial_repeats = (1, 1) if args.quick else (args.repeats, args.tutorial_repeats)
    parts = set(args.parts.split(",")) | ({"coco"} if device.type == "cuda" or args.coco else set())
    unknown = parts - {"train", "beam", "cache", "coco", "transformer", "loader", "scst", "caption"}
    if unknown:
        raise SystemExit(f"--parts: unknown {', '.join(sorted(unknown))}")
    loader = loader_sizes(args) if "loader" in parts else None
    if loader is not None:  # a disk too small is refused before anything is measured
        loader_speed.cache_parent(args.loader_dir, loader)
    torch.manual_seed(0)
    slow_bf16 = bf16_cost(device, "bf16" if args.amp else "none")
    if slow_bf16:  # said before anything is measured: the bf16 parts may take an hour there
        print(f"note: {slow_bf16}", file=sys.stderr, flush=True)
    results: dict[str, Any] = {
        **environment(device, threads, args.amp),
        "quick": args.quick,
        "repeats": repeats,
        "tutorial_repeats": tutorial_repeats,
        "sizes": asdict(sizes),
    }
    results["matmul_peak_gflops"], results["matmul_peak_mem_mb"] = matmul_peak(
        sizes, device, repeats, torch.float32
    )
    peak = results["matmul_peak_gflops"]
    if results["amp"]:
        results["matmul_peak_bf16_gflops"], _ = matmul_peak(sizes, device, repeats, torch.bfloat16)
        peak = results["matmul_peak_bf16_gflops"]

    decoder = ShowAttendTellDecoder.from_config(decoder_config(sizes), sizes.vocab_size, sizes.channels)
    decoder.to(device)
    if "train" in parts:
        tutorial = TutorialDecoder.from_ours(decoder)
        results.update(training(sizes, decoder, tutorial, device, repeats, tutorial_repeats, results["amp"]))
        results["train_mfu"] = results["train_gflops"] / peak
        if results["amp"]:
            results["train_mfu_fp32"] = results["train_gflops_fp32"] / results["matmul_peak_gflops"]
    if "beam" in parts:
        results.update(beam_decoding(sizes, decoder, device, repeats, tutorial_repeats, results["amp"]))
    if "cache" in parts:
        results.update(feature_cache(sizes, device, min(repeats, 3), results["amp"]))
    if "coco" in parts:
        results.update(coco_epoch(sizes, decoder, device, results["amp"]))
    if "transformer" in parts:
        transformer_sizes = transformer_speed.QUICK if args.quick else transformer_speed.TransformerSizes()
        results["transformer_sizes"] = asdict(transformer_sizes)
        results.update(
            transformer_speed.measure(
                transformer_sizes, device, repeats, tutorial_repeats, results["amp"], peak
            )
        )
    if "scst" in parts:
        scst_sizes = scst_speed.QUICK if args.quick else scst_speed.ScstSizes()
        results["scst_sizes"] = asdict(scst_sizes)
        results.update(
            scst_speed.measure(
                scst_sizes,
                decoder_config(sizes),
                sizes.vocab_size,
                sizes.grid,
                sizes.channels,
                COCO_WORDS,
                device,
                repeats,
                results["amp"],
            )
        )
        results.update(
            scst_speed.selfcritical(
                scst_sizes,
                decoder_config(sizes),
                sizes.vocab_size,
                sizes.grid,
                sizes.channels,
                COCO_WORDS,
                device,
                tutorial_repeats,
            )
        )
        results["speedup_scst"] = results["selfcritical_scst_step_ms"] / results["scst_step_ms"]
        results["speedup_scst_same_decoder"] = (
            results["selfcritical_scst_step_ms_our_decoder"] / results["scst_step_ms"]
        )
    if "caption" in parts:
        caption_sizes = caption_speed.QUICK if args.quick else caption_speed.CaptionSizes()
        results["caption_sizes"] = asdict(caption_sizes)
        results.update(
            caption_speed.measure(
                caption_sizes, decoder_config(sizes), sizes.vocab_size, device, repeats, tutorial_repeats
            )
        )
    if loader is not None:
        results.update(loader_speed.measure(loader, args.loader_dir, device, COCO_WORDS))
    return results


def loader_sizes(args: argparse.Namespace) -> loader_speed.LoaderSizes:
    """The loader part's cache: COCO's size (tiny with --quick), as --loader-images and --loader-grid say."""
    sizes = loader_speed.QUICK if args.quick else loader_speed.LoaderSizes()
    if args.loader_images is not None:
        if args.loader_images < 1:
            raise SystemExit(f"--loader-images: must be at least 1, got {args.loader_images}")
        sizes = replace(sizes, images=args.loader_images)
    if args.loader_grid is not None:
        side, channels = loader_speed.parse_grid(args.loader_grid)
        sizes = replace(sizes, side=side, channels=channels)
    return sizes


def print_table(results: dict[str, Any]) -> None:
    print(
        f"{results['device_name']} | {results['threads']} threads | torch {results['torch']} | "
        f"amp {results['amp']} | "
        f"load {results['load_average_start']:.2f} -> {results['load_average_end']:.2f}"
        f" | other processes {results['other_processes_cores'] or 0:.2f} cores"
    )
    for key, value in results.items():
        if key in (
            "sizes",
            "transformer_sizes",
            "scst_sizes",
            "caption_sizes",
            "device",
            "device_name",
            "cpu",
            "threads",
            "amp",
            "torch",
            "captioning",
        ):
            continue
        if isinstance(value, dict):
            value = ", ".join(f"k={k}: {v:.3g}" for k, v in value.items())
        elif isinstance(value, float):
            value = f"{value:.4g}"
        print(f"  {key:32s} {value}")


if __name__ == "__main__":
    arguments = get_args_parser().parse_args()
    outcome = main(arguments)
    if arguments.json:
        print(json.dumps(outcome))
    else:
        print_table(outcome)
