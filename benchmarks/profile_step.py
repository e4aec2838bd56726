"""Where the reference training step spends its time: ``torch.profiler`` over a few steps.

    python benchmarks/profile_step.py                 # float32, reference sizes, 3 profiled steps
    python benchmarks/profile_step.py --amp           # the same under bf16 autocast

Prints the time of each phase (forward, loss, backward, Adam step) and the operators with the most
self time, over the profiled steps (after 2 warm-up steps). The step is ``speed.py``'s
``our_train_step`` on its batch: 32 captions of 22 tokens, one image each, 14x14x2048 grids.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

from harness import autocast
from speed import Sizes, decoder_config, random_captions

from captioning.models.decoder import ShowAttendTellDecoder
from captioning.training.losses import caption_loss
from captioning.training.optim import adam

PHASES = ("forward", "loss", "backward", "optimizer")


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=3, help="profiled steps (default 3)")
    parser.add_argument("--amp", action="store_true", help="bf16 autocast")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (default: the usable cores)")
    parser.add_argument("--rows", type=int, default=20, help="operators listed (default 20)")
    return parser


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    device = torch.device("cpu")
    sizes = Sizes()
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    decoder = ShowAttendTellDecoder.from_config(
        decoder_config(sizes), sizes.vocab_size, sizes.channels
    ).train()
    optimizer = adam(decoder.parameters(), lr=4e-4)
    annotations = torch.rand(sizes.batch, sizes.positions, sizes.channels, generator=generator)
    captions, lengths = random_captions(sizes, sizes.batch, None, device, generator)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, args.amp):
            with record_function("forward"):
                output = decoder(annotations, captions, lengths, None)
            with record_function("loss"):
                loss = caption_loss(output, captions, penalty_weight=1.0).total
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            optimizer.step()

    for _ in range(2):
        step()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        for _ in range(args.steps):
            step()
    wall = (time.perf_counter() - start) / args.steps
    events = profiler.key_averages()
    print(
        f"{torch.get_num_threads()} threads, amp {args.amp}: {wall * 1e3:.0f} ms per step "
        f"(profiled; the profiler adds a little)"
    )
    for event in events:
        if event.key in PHASES:
            print(f"  {event.key:10s} {event.cpu_time_total / args.steps / 1e3:8.1f} ms")
    print(events.table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main(get_args_parser().parse_args())
