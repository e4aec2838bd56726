"""A small faithfulness study on one device, timed, and checked against the same study on the CPU.

    python benchmarks/gpu_study.py --device cuda      # what gpu_check.py runs (its "study" part)
    python benchmarks/gpu_study.py --device cpu       # the same code on the CPU (a few minutes)

Built in the process, nothing read but the offline pretrained encoder: Shapes images at the demo's
288 px (generated in a temporary folder), a captioner of the demo's sizes (EfficientNet-Lite0, 9x9
grid; the LSTM of ``configs/shapes.yaml``) with a seeded untrained decoder, each image's first
reference caption as the explained caption (a study explains any caption: no decoding is needed to
time it). The study is ``evaluate.py --faithfulness``'s (every method that fits, grid curves, 3
random seeds, the cascade on ``--sanity-images``), with RISE's pixel protocol on ``--pixel-images``
of the images. Printed as one JSON object: the wall-clock seconds of the study and of its pixel part
per image, and the largest difference of its areas from the CPU's on ``--check-images`` images
(attention and occlusion, 2 pixel steps; ``null`` on the CPU itself).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace

import torch

from captioning.config import EncoderConfig, LSTMDecoderConfig, ModelConfig
from captioning.data import build_vocabulary
from captioning.data.images import load_image
from captioning.data.shapes import generate_shapes, read_shapes
from captioning.explain.config import ExplainConfig
from captioning.explain.methods import applicable_methods
from captioning.explain.pixel_curves import PixelInputs
from captioning.explain.study import faithfulness_study
from captioning.models.captioner import Captioner


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda", help="cuda or cpu")
    parser.add_argument("--images", type=int, default=32, help="images of the grid study (32)")
    parser.add_argument("--pixel-images", type=int, default=4, help="images of the pixel protocol (4)")
    parser.add_argument("--sanity-images", type=int, default=8)
    parser.add_argument("--check-images", type=int, default=2, help="images also studied on the CPU (2)")
    return parser


def build(images: int) -> tuple[Captioner, torch.Tensor, list[list[int]], list[list[str]], list[int]]:
    """The captioner and the first ``images`` Shapes test images (normalised), captions and ids."""
    with tempfile.TemporaryDirectory(prefix="gpu_study_") as folder:
        generate_shapes(folder, num_train=50, num_val=1, num_test=images, image_size=288)
        records = read_shapes(folder)
        vocab = build_vocabulary(records, 1)
        torch.manual_seed(0)
        config = ModelConfig(
            encoder=EncoderConfig(
                name="efficientnet_lite0", weights="pretrained", image_size=288, grid_size=0
            ),
            decoder=LSTMDecoderConfig(
                embed_dim=128, hidden_dim=256, attention_dim=128, scoring="scaled_dot", gate="scalar"
            ),
        )
        model = Captioner.build(config, vocab).eval()
        test = [record for record in records if record.split == "test"][:images]
        pixels = torch.stack([model.encoder.transform(load_image(record.path)) for record in test])
    words = [list(record.captions[0]) for record in test]
    tokens = [[vocab.stoi[word] for word in caption] for caption in words]
    return model, pixels, tokens, words, [record.image_id for record in test]


def study(model: Captioner, pixels: torch.Tensor, tokens, words, ids, settings, device) -> tuple[dict, float]:
    """The study on ``device`` and its wall-clock seconds."""
    model = model.to(device)
    start = time.perf_counter()
    with torch.no_grad():
        grids = model.encode(pixels.to(device)).float()
    on_pixels = PixelInputs(model.encode, lambda first, stop: pixels[first:stop].to(device), model.grid)
    baseline = torch.zeros(grids.size(-1), device=device)  # a fixed baseline: the two devices agree
    result = faithfulness_study(
        model.decoder,
        grids,
        tokens,
        words,
        ids,
        model.grid,
        settings,
        baseline,
        progress=False,
        pixels=on_pixels,
    )
    if device.type == "cuda":
        torch.cuda.synchronize()
    return result, time.perf_counter() - start


def largest_difference(first: dict, second: dict) -> float:
    """The largest difference of the two studies' areas (grid and pixel, every method and the control)."""
    differences = []
    for table_a, table_b in ((first, second), (first.get("pixel"), second.get("pixel"))):
        if table_a is None or table_b is None:
            continue
        for name in ["random", *table_a["methods"]]:
            row_a = table_a["random"] if name == "random" else table_a["methods"][name]
            row_b = table_b["random"] if name == "random" else table_b["methods"][name]
            differences += [abs(row_a[key] - row_b[key]) for key in ("deletion_auc", "insertion_auc")]
    return max(differences)


def main(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    model, pixels, tokens, words, ids = build(args.images)
    settings = ExplainConfig(methods=applicable_methods(model.decoder), sanity_images=args.sanity_images)
    result: dict = {"device": args.device, "images": args.images, "words": sum(map(len, tokens))}
    grid_study, seconds = study(model, pixels, tokens, words, ids, settings, device)
    result.update(study_s=seconds, study_s_per_image=seconds / args.images)
    count = args.pixel_images
    pixel = replace(settings, sanity_images=0, pixel_steps=10)
    pixel_study, pixel_seconds = study(
        model, pixels[:count], tokens[:count], words[:count], ids[:count], pixel, device
    )
    result.update(pixel_study_s=pixel_seconds, pixel_study_s_per_image=pixel_seconds / count)
    result["pixel_rank_agreement"] = pixel_study["pixel"]["rank_agreement"]
    result["largest_area_difference_from_cpu"] = None
    if device.type != "cpu" and args.check_images:
        count = args.check_images  # attention and occlusion, 2 pixel steps: seconds on the CPU
        check = replace(pixel, methods=("attention", "occlusion"), pixel_steps=2)
        part = (pixels[:count], tokens[:count], words[:count], ids[:count])
        on_cpu, _ = study(model, *part, check, torch.device("cpu"))
        on_device, _ = study(model, *part, check, device)
        result["largest_area_difference_from_cpu"] = largest_difference(on_cpu, on_device)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main(get_args_parser().parse_args())
