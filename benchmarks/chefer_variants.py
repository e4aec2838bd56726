"""How far this project's gradient-weighted rollout is from Chefer et al.'s rules on tiny Transformers.

For untrained Transformer decoders (random weights, one per seed) over random 7x7 grids and random
8-word captions, each word's ``chefer`` map beside its ``gradient_rollout`` map: the Spearman rank
correlation over the 49 cells, whether the top cell is the same, and how many ``chefer`` maps are 0
everywhere (every cross-attention update zeroed by the reference's NaN rule). Prints one JSON object.

    python benchmarks/chefer_variants.py [--seeds 10]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from scipy.stats import spearmanr

from captioning.config import TransformerDecoderConfig
from captioning.explain import ExplainInputs, ExplainSettings, explain
from captioning.explain.scoring import WordScorer, caption_tensor
from captioning.models.transformer import TransformerDecoder

VOCAB, CHANNELS, GRID, IMAGES, WORDS = 30, 16, (7, 7), 4, 8


def compare(seed: int) -> list[tuple[float, bool, bool]]:
    """(rank correlation, same top cell, chefer map all 0) per word of one seed's model."""
    torch.manual_seed(seed)
    config = TransformerDecoderConfig(
        d_model=32, num_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0
    )
    decoder = TransformerDecoder.from_config(config, VOCAB, CHANNELS, GRID).double().eval()
    cells = GRID[0] * GRID[1]
    annotations = torch.rand(IMAGES, cells, CHANNELS, dtype=torch.float64)
    tokens = torch.randint(4, VOCAB, (IMAGES, WORDS)).tolist()
    captions, lengths = caption_tensor(tokens, 1, 2)
    inputs = ExplainInputs(
        WordScorer(decoder, captions, lengths), annotations, annotations.mean((0, 1)), ExplainSettings(2, 64)
    )
    reference, variant = explain("chefer", inputs).numpy(), explain("gradient_rollout", inputs).numpy()
    rows = []
    for b in range(IMAGES):
        for t in range(WORDS):
            zero = not reference[b, t].any()
            rho = float("nan") if zero else float(spearmanr(reference[b, t], variant[b, t]).statistic)
            same_top = int(reference[b, t].argmax()) == int(variant[b, t].argmax())
            rows.append((rho, same_top, zero))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [row for seed in range(args.seeds) for row in compare(seed)]
    rho = np.array([r for r, _, zero in rows if not zero])
    result = {
        "words": len(rows),
        "chefer maps all zero": sum(zero for _, _, zero in rows),
        "spearman median": float(np.median(rho)),
        "spearman quartiles": [float(np.quantile(rho, 0.25)), float(np.quantile(rho, 0.75))],
        "spearman mean": float(rho.mean()),
        "same top cell": float(np.mean([same for _, same, zero in rows if not zero])),
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
