"""Batched beam search against the same beam search run image by image.

    python benchmarks/batched_beam.py

The reference decoder sizes of speed.py (14x14x2048 grids, sizes 512, vocabulary 9490, untrained
weights), 16 images, maximum length 50; median of 3 interleaved runs.
"""

import statistics
import time

import torch

from captioning.config import DecodeConfig, LSTMDecoderConfig
from captioning.models.decoder import ShowAttendTellDecoder
from captioning.models.decoding import beam_search


def main() -> None:
    torch.manual_seed(0)
    config = LSTMDecoderConfig(
        embed_dim=512,
        hidden_dim=512,
        attention_dim=512,
        gate="channel",
        activation="relu",
        deep_output=False,
        dropout=0.5,
    )
    decoder = ShowAttendTellDecoder.from_config(config, 9490, 2048).eval()
    grids = torch.randn(16, 196, 2048)  # (B, P, C)
    for beam in (3, 5):
        beam_search(
            decoder, grids[:2], DecodeConfig(beam_size=beam, max_length=50, forbid_unk=False)
        )  # warm-up
        batched, single = [], []
        for _ in range(3):
            start = time.perf_counter()
            beam_search(decoder, grids, DecodeConfig(beam_size=beam, max_length=50, forbid_unk=False))
            batched.append(time.perf_counter() - start)
            start = time.perf_counter()
            for i in range(len(grids)):
                beam_search(
                    decoder, grids[i : i + 1], DecodeConfig(beam_size=beam, max_length=50, forbid_unk=False)
                )
            single.append(time.perf_counter() - start)
        b, s = statistics.median(batched), statistics.median(single)
        print(
            f"beam {beam}: batched {len(grids) / b:.1f} captions/s, image by image {len(grids) / s:.1f} "
            f"captions/s, x{s / b:.2f}"
        )


if __name__ == "__main__":
    main()
