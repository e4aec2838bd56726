"""The grids and sizes of docs/backbones.md: what each encoder reports about itself.

For each name, the encoder is built with random weights on the meta device (the real modules and
forward pass, shapes only: no memory, no arithmetic, no download) at the image size its weights were
trained at, and reports its parameters (the network the grid comes from), channels, grid, the
float16 feature-cache row it gives, and the preprocessing read from its weights' definition.

    python benchmarks/backbone_table.py                      # the registry and a few timm / open_clip models
    python benchmarks/backbone_table.py timm:resnet50.a1_in1k open_clip:ViT-L-14/openai=336
"""

from __future__ import annotations

import argparse

import torch

from captioning.models.encoders import ENCODERS, Encoder, encoder_builder

EXAMPLES = [
    "timm:vit_small_patch16_224.augreg_in21k_ft_in1k",
    "timm:vit_base_patch16_clip_224.openai",
    "timm:convnext_base.fb_in22k",
    "timm:swin_base_patch4_window12_384=384",
    "open_clip:ViT-B-32/openai",
    "open_clip:ViT-B-16/openai",
    "open_clip:ViT-L-14/openai",
]
TRAINED_AT = {"swin_v2_b": 256}  # image sizes other than 224 of the registered weights


def row(name: str, size: int) -> str:
    """One Markdown table row for ``name`` at ``size`` px."""
    with torch.device("meta"):
        encoder = Encoder(name, encoder_builder(name)("none", size), image_size=size, grid_size=0)
    parameters = sum(p.numel() for p in encoder.backbone.parameters()) / 1e6
    positions = encoder.grid[0] * encoder.grid[1]
    mean = ", ".join(f"{m:.3f}" for m in encoder.mean)
    return (
        f"| `{name}` | {parameters:.1f} | {size} | {encoder.channels} | "
        f"{encoder.grid[0]}x{encoder.grid[1]} | "
        f"{positions * encoder.channels * 2 / 1024:.0f} KiB | {encoder.interpolation.value}, mean ({mean}) |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("names", nargs="*", help="encoder names, each optionally =<image size> (default 224)")
    args = parser.parse_args()
    names = args.names or [*sorted(ENCODERS), *EXAMPLES]
    print("| name | parameters (M) | image px | channels | grid | float16 cache per image | preprocessing |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for entry in names:
        name, _, size = entry.partition("=")
        print(row(name, int(size) if size else TRAINED_AT.get(name, 224)), flush=True)


if __name__ == "__main__":
    main()
