"""A trained captioner as ONNX graphs: the encoder, and the decoder's protocol one call per graph.

Four graphs, each traced from the PyTorch modules (``torch.onnx.export``, the TorchScript-based
exporter: it needs nothing beyond torch and onnx) and checked with ``onnx.checker``:

=====================  ==============================================================================
``encoder.onnx``       ``images`` (B, 3, S, S) normalised -> ``annotations`` (B, P, C)
``decoder_prepare``    ``annotations`` (B, P, C) -> ``prepared_0..`` the per-image work (``prepare``)
``decoder_init``       ``annotations`` (B, P, C) -> ``state_0..`` the state before the first word
``decoder_step``       ``tokens`` (N,), ``prepared_*`` (B, ...), ``state_*`` (N, ...) -> ``logits``
                       (N, V), ``alpha`` (N, P), ``beta`` (N,) with a gate, ``next_state_*`` (N, ...)
=====================  ==============================================================================

The step takes the images' prepared tensors once per image and N = B * G rows (G beams or samples
per image, image-major): G is read from the shapes inside the graph, as ``Prepared.group`` is in
PyTorch. A state's tensors are whatever the decoder keeps (an LSTM's h and c, a GRU's h alone; a
Transformer's per-layer self-attention keys and values, whose length axis grows by one each step): a
state is a ``NamedTuple`` of tensors (or of tuples of them), flattened in order and rebuilt with its
class, so any decoder family whose ``prepare``, ``init_state`` and ``step`` trace is exported the
same way (``tests/export_checks.py`` checks every registered family).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from captioning.data.vocab import Vocabulary
from captioning.export.layout import ENCODER, INIT, PREPARE, STEP, StepLayout
from captioning.models.base import CaptionDecoder
from captioning.models.captioner import Captioner

OPSET = 17  # LayerNormalization is an operator from opset 17 on; ONNX Runtime 1.17 runs up to 20
# A graph whose weights pass this keeps them beside it, in ``<graph>.data`` (ONNX's external data: one
# protobuf file holds at most 2 GiB); its hash is config.json's as the graph's is.
EXTERNAL_WEIGHTS_BYTES = 2**30


def flatten(value: Any) -> list[Tensor]:
    """The tensors of a (named) tuple tree, depth first; other leaves (``group``) are left out."""
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, tuple):
        return [tensor for item in value for tensor in flatten(item)]
    return []


def rebuild(template: Any, tensors: Iterator[Tensor]) -> Any:
    """``template`` with its tensors replaced by the next ones of ``tensors`` (``flatten``'s inverse)."""
    if isinstance(template, Tensor):
        return next(tensors)
    if isinstance(template, tuple):
        items = [rebuild(item, tensors) for item in template]
        return type(template)(*items) if hasattr(template, "_fields") else tuple(items)
    return template


class _Encode(nn.Module):
    def __init__(self, captioner: Captioner):
        super().__init__()
        self.encoder = captioner.inference_encoder()  # what PyTorch captioning runs: batch norms folded

    def forward(self, images: Tensor) -> Tensor:
        return self.encoder(images)  # (B, P, C)


class _Prepare(nn.Module):
    def __init__(self, decoder: CaptionDecoder):
        super().__init__()
        self.decoder = decoder

    def forward(self, annotations: Tensor) -> tuple[Tensor, ...]:
        return tuple(flatten(self.decoder.prepare(annotations)))


class _Init(_Prepare):
    def forward(self, annotations: Tensor) -> tuple[Tensor, ...]:
        return tuple(flatten(self.decoder.init_state(annotations)))


class _Step(nn.Module):
    """``decoder.step`` over flat tensors; the rows per image come from the shapes (traced, not fixed)."""

    def __init__(self, decoder: CaptionDecoder, prepared: Any, state: Any, layout: StepLayout):
        super().__init__()
        self.decoder, self.prepared, self.state, self.layout = decoder, prepared, state, layout

    def forward(self, tokens: Tensor, *tensors: Tensor) -> tuple[Tensor, ...]:
        count = self.layout.prepared
        group = tokens.size(0) // tensors[0].size(0)  # N rows over B images: traced from the shapes
        prepared = rebuild(self.prepared, iter(tensors[:count]))._replace(group=group)
        state = rebuild(self.state, iter(tensors[count:]))
        output = self.decoder.step(prepared, tokens, state)
        beta = (output.beta,) if self.layout.beta and output.beta is not None else ()
        # the logits (the repetition penalty's sign rule reads them); their log-softmax is log_probs
        scores = output.logits if output.logits is not None else output.log_probs
        return (scores, output.alpha, *beta, *flatten(output.state))


def _export(
    module: nn.Module,
    inputs: tuple[Tensor, ...],
    path: Path,
    input_names: Sequence[str],
    output_names: Sequence[str],
    dynamic_axes: dict[str, dict[int, str]],
) -> None:
    import onnx

    before = set(path.parent.iterdir())
    with warnings.catch_warnings():
        # The exporter announces its successor and notes the slices it could not fold; neither
        # changes the graph written.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module.eval(),
            inputs,
            str(path),
            dynamo=False,
            input_names=list(input_names),
            output_names=list(output_names),
            dynamic_axes=dynamic_axes,
            opset_version=OPSET,
        )
    _weights_beside(path, set(path.parent.iterdir()) - before - {path})
    onnx.checker.check_model(str(path), full_check=True)


def _weights_beside(path: Path, written: set[Path]) -> None:
    """Keep the weights of the graph at ``path`` in one file beside it, ``<graph>.data``, when they pass
    ``EXTERNAL_WEIGHTS_BYTES`` (``written``: the files the exporter wrote beside it, replaced)."""
    import onnx

    model = onnx.load(str(path))  # with the weights of ``written``, if any
    if sum(tensor.ByteSize() for tensor in model.graph.initializer) <= EXTERNAL_WEIGHTS_BYTES:
        return
    location = f"{path.name}.data"
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=location,
        size_threshold=0,
    )
    for file in written - {path.parent / location}:
        file.unlink()


def _growing_axes(before: list[Tensor], after: list[Tensor]) -> list[list[int]]:
    """Per state tensor, the axes beyond the rows whose size changes from one step to the next."""
    return [
        [axis for axis in range(1, first.dim()) if first.size(axis) != second.size(axis)]
        for first, second in zip(before, after, strict=True)
    ]


@torch.no_grad()
def export_graphs(captioner: Captioner, folder: Path) -> StepLayout:
    """Write the four graphs of ``captioner`` (on the CPU, in eval mode) into ``folder``.

    Returns:
        The layout of the decoder's tensors in the graphs.
    """
    size = captioner.encoder.image_size
    images = torch.randn(2, 3, size, size)
    _export(
        _Encode(captioner),
        (images,),
        folder / ENCODER,
        ["images"],
        ["annotations"],
        {"images": {0: "images"}, "annotations": {0: "images"}},
    )
    return export_decoder_graphs(captioner.decoder, captioner.encode(images), folder)


@torch.no_grad()
def export_decoder_graphs(decoder: CaptionDecoder, annotations: Tensor, folder: Path) -> StepLayout:
    """Write ``decoder``'s three graphs (prepare, init, step) into ``folder``, traced on
    ``annotations`` (2, P, C).

    The step is traced on 2 rows per image, two words in, so that no axis the graphs keep dynamic
    has size 0 or 1 when traced (the tracer would take such a size for a constant).
    """
    prepared = decoder.prepare(annotations)
    state = decoder.init_state(annotations)
    prepared_tensors, state_tensors = flatten(prepared), flatten(state)
    if not state_tensors:  # a state the export cannot see into would be written as no state at all
        raise TypeError(
            f"{type(decoder).__name__}.init_state gives a {type(state).__name__} holding no tensors the "
            "export can flatten: a decoder's state is a NamedTuple of tensors (captioning.models.base)"
        )
    rows = torch.tensor([0, 0, 1, 1])  # 2 rows per image
    tokens = torch.full((4,), Vocabulary.start_id, dtype=torch.long)
    grouped = prepared._replace(group=2)
    first = decoder.step(grouped, tokens, state.select(rows))
    second = decoder.step(grouped, tokens, first.state)
    layout = StepLayout(len(prepared_tensors), len(state_tensors), first.beta is not None)
    growing = _growing_axes(flatten(first.state), flatten(second.state))

    per_image = {name: {0: "images"} for name in ["annotations", *layout.prepared_names()]}
    _export(
        _Prepare(decoder),
        (annotations,),
        folder / PREPARE,
        ["annotations"],
        layout.prepared_names(),
        per_image,
    )
    _export(
        _Init(decoder),
        (annotations,),
        folder / INIT,
        ["annotations"],
        layout.state_names(),
        {"annotations": {0: "images"}, **{name: {0: "images"} for name in layout.state_names()}},
    )
    step_axes = {
        **{name: {0: "images"} for name in layout.prepared_names()},
        "tokens": {0: "rows"},
        "logits": {0: "rows"},
        "alpha": {0: "rows"},
        "beta": {0: "rows"},
    }
    for index, axes in enumerate(growing):
        step_axes[f"state_{index}"] = {0: "rows", **{axis: f"length_{index}_{axis}" for axis in axes}}
        step_axes[f"next_state_{index}"] = {0: "rows", **{axis: f"next_{index}_{axis}" for axis in axes}}
    _export(
        _Step(decoder, prepared, state, layout),
        (tokens, *prepared_tensors, *flatten(second.state)),
        folder / STEP,
        ["tokens", *layout.prepared_names(), *layout.state_names()],
        layout.step_outputs(),
        {name: axes for name, axes in step_axes.items() if name != "beta" or layout.beta},
    )
    return layout
