"""Adebayo et al. 2018's randomisation tests: which parameters each stage re-draws (against the models'
own parameter names), the four similarity measures against computations written here (scipy's
``spearmanr`` on the raveled maps; a plain bilinear stretch, scikit-image's SSIM and HOG), attention's
maps exactly unchanged by the output layers, a method that ignores the model similar at every stage,
and the shuffled captions of the data randomisation test."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import pearsonr, spearmanr
from skimage.feature import hog
from skimage.metrics import structural_similarity

from captioning.config import LSTMDecoderConfig, TransformerDecoderConfig
from captioning.data.records import ImageRecord, shuffled_captions
from captioning.explain.captions import explain_batch
from captioning.explain.methods import ExplainSettings
from captioning.explain.sanity import (
    data_randomisation_test,
    fresh_parameters,
    randomisation_stages,
    randomisation_test,
    randomised,
)
from captioning.explain.scoring import WordScorer, caption_tensor
from captioning.explain.similarity import MEASURES, similarities
from captioning.models.decoder import ShowAttendTellDecoder
from captioning.models.transformer import TransformerDecoder

pytestmark = pytest.mark.usefixtures("single_thread")

GRID, C = (3, 3), 4
P = GRID[0] * GRID[1]
TOKENS = [[4, 7, 5], [6, 8], [9, 4, 4, 10]]


def lstm(**options) -> ShowAttendTellDecoder:
    torch.manual_seed(0)
    config = LSTMDecoderConfig(embed_dim=8, hidden_dim=8, attention_dim=8, dropout=0.0, **options)
    return ShowAttendTellDecoder.from_config(config, 11, C).eval()


def transformer(tie: bool = True) -> TransformerDecoder:
    torch.manual_seed(0)
    config = TransformerDecoderConfig(
        d_model=8, num_heads=2, d_ff=16, encoder_layers=2, decoder_layers=2, dropout=0.0, tie_embeddings=tie
    )
    return TransformerDecoder.from_config(config, 11, C, GRID).eval()


def grids() -> torch.Tensor:
    return torch.rand(len(TOKENS), P, C, generator=torch.Generator().manual_seed(0))


def word_mask(decoder) -> torch.Tensor:
    return WordScorer(decoder, *caption_tensor(TOKENS, 1, 2)).word_mask


def maps_function(methods: list[str]):
    annotations = grids()

    def maps_of(model):
        return explain_batch(
            model, annotations, TOKENS, methods, torch.zeros(C), ExplainSettings(ig_steps=2)
        )[0]

    return maps_of


def names(decoder, *prefixes: str) -> list[str]:
    """The decoder's parameter names (``named_parameters``) under these module prefixes, in its order."""
    return [name for name, _ in decoder.named_parameters() if name.startswith(prefixes)]


def test_the_lstm_cascade_goes_from_the_output_layer_down():
    decoder = lstm(init_layers=2)
    stages = randomisation_stages(decoder)
    expected = [
        ("output layer", names(decoder, "out.")),
        ("deep output", names(decoder, "hidden_to_out.", "context_to_out.")),
        (
            "recurrence",
            names(decoder, "recurrent_to_gates.", "embed_to_gates.", "init_h.", "init_c.", "init_mlp."),
        ),
        ("attention", names(decoder, "attention.", "gate.")),
        ("embeddings", names(decoder, "embedding.")),
    ]
    assert [stage.name for stage in stages] == [name for name, _ in expected]
    for stage, (_, parameters) in zip(stages, expected, strict=True):
        assert sorted(stage.parameters) == sorted(parameters) and parameters
    every = [name for stage in stages for name in stage.parameters]
    assert sorted(every) == sorted(name for name, _ in decoder.named_parameters())  # each once


def test_the_transformer_cascade_goes_block_by_block_and_tied_weights_go_with_the_output_layer():
    decoder = transformer(tie=True)
    stages = randomisation_stages(decoder)
    assert [stage.name for stage in stages] == [
        "output layer (tied to the embeddings)",
        "decoder block 2",
        "decoder block 1",
        "grid encoder block 2",
        "grid encoder block 1",
        "grid projection",
    ]  # the embeddings are the output layer's weight: re-drawn with it, no stage of their own
    assert sorted(stages[0].parameters) == ["embedding.weight", "out.bias"]
    assert sorted(stages[1].parameters) == sorted(names(decoder, "blocks.1."))
    assert sorted(stages[2].parameters) == sorted(names(decoder, "blocks.0."))
    assert sorted(stages[3].parameters) == sorted(names(decoder, "grid_encoder.1."))
    assert sorted(stages[4].parameters) == sorted(names(decoder, "grid_encoder.0."))
    assert sorted(stages[5].parameters) == sorted(names(decoder, "grid_projection."))
    untied = randomisation_stages(transformer(tie=False))
    assert untied[0].name == "output layer" and sorted(untied[0].parameters) == ["out.bias", "out.weight"]
    assert untied[3].name == "embeddings" and untied[3].parameters == ("embedding.weight",)


@pytest.mark.parametrize("make", [lstm, transformer], ids=["lstm", "transformer"])
def test_each_stage_redraws_its_parameters_and_only_those(make):
    decoder = make()
    with torch.no_grad():  # "trained": every parameter away from its initialisation (biases 0, norms 1)
        for value in decoder.parameters():
            value.add_(0.01 * torch.randn(value.shape, generator=torch.Generator().manual_seed(9)))
    trained = {name: value.detach().clone() for name, value in decoder.named_parameters()}
    stages = randomisation_stages(decoder)
    seen: list[set[str]] = []

    def maps_of(model):
        # which parameters differ from the trained decoder's in the model this stage explains
        seen.append(
            {name for name, value in model.named_parameters() if not torch.equal(value, trained[name])}
        )
        return {"constant": torch.ones(len(TOKENS), word_mask(decoder).size(1), P)}

    randomisation_test(decoder, maps_of, word_mask(decoder), GRID, 32, independent=True)
    cumulative = [set().union(*(s.parameters for s in stages[: k + 1])) for k in range(len(stages))]
    alone = [set(stage.parameters) for stage in stages]
    assert seen == [set(), *cumulative, *alone]  # the trained model first, then the cascade, then alone
    for name, value in decoder.named_parameters():  # the trained decoder is left as it was
        assert torch.equal(value, trained[name])


def test_redrawn_values_come_from_the_models_own_initialisation():
    decoder = lstm()
    fresh = fresh_parameters(decoder, seed=5)
    assert fresh.keys() == dict(decoder.named_parameters()).keys()
    assert fresh["embedding.weight"].abs().max() <= 0.1  # the decoder's U(-0.1, 0.1), not N(0, 1)
    forget = fresh["embed_to_gates.bias"][8:16]
    assert torch.equal(forget, torch.ones(8))  # the forget gate's bias 1
    again = fresh_parameters(decoder, seed=5)
    assert all(torch.equal(fresh[name], again[name]) for name in fresh)  # same seed, same draw


def stretch(cells: np.ndarray, size: int) -> np.ndarray:
    """Bilinear interpolation with half-pixel centres (each cell's value at its centre), by hand."""
    rows, columns = cells.shape

    def axis(count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        source = np.clip((np.arange(size) + 0.5) * count / size - 0.5, 0, count - 1)
        low = np.floor(source).astype(int)
        return low, np.minimum(low + 1, count - 1), source - low

    r0, r1, fr = axis(rows)
    c0, c1, fc = axis(columns)
    top = cells[r0][:, c0] * (1 - fc) + cells[r0][:, c1] * fc
    bottom = cells[r1][:, c0] * (1 - fc) + cells[r1][:, c1] * fc
    return top * (1 - fr[:, None]) + bottom * fr[:, None]


def test_each_similarity_equals_its_independent_computation():
    generator = np.random.default_rng(3)
    before = generator.normal(size=(4, P))
    after = before + generator.normal(scale=0.7, size=(4, P))
    after[1] = -before[1]  # a sign flip: signed -1, absolute 1
    size = 32
    result = similarities(torch.tensor(before), torch.tensor(after), GRID, size)
    signed = [spearmanr(b.ravel(), a.ravel()).statistic for b, a in zip(before, after, strict=True)]
    absolute = [spearmanr(np.abs(b), np.abs(a)).statistic for b, a in zip(before, after, strict=True)]

    def image(cells: np.ndarray) -> np.ndarray:
        return np.round(stretch(cells.reshape(GRID) / np.abs(cells).max(), size), 10)

    ssim = [
        structural_similarity(image(b), image(a), data_range=2.0) for b, a in zip(before, after, strict=True)
    ]
    hogs = [pearsonr(hog(image(b)), hog(image(a))).statistic for b, a in zip(before, after, strict=True)]
    assert signed[1] == pytest.approx(-1.0) and absolute[1] == pytest.approx(1.0)
    assert result["spearman"] == pytest.approx(np.mean(signed), abs=1e-9)
    assert result["spearman_abs"] == pytest.approx(np.mean(absolute), abs=1e-9)
    assert result["ssim"] == pytest.approx(np.mean(ssim), abs=1e-9)
    assert result["hog"] == pytest.approx(np.mean(hogs), abs=1e-9)
    assert all(result[f"words_{measure}"] == 4 for measure in MEASURES)


def test_a_constant_map_is_left_out_of_the_rank_correlations():
    before = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0], [0.0] * 9])
    result = similarities(before, before * 3, GRID, 32)
    assert result["spearman"] == pytest.approx(1.0) and result["words_spearman"] == 1
    assert result["ssim"] == pytest.approx(1.0) and result["words_ssim"] == 2  # equal images, zeros too


@pytest.mark.parametrize("make", [lstm, lambda: lstm(deep_output=False)], ids=["deep", "shallow"])
def test_attention_is_exactly_unchanged_by_the_output_layers(make):
    decoder = make()
    stages = randomisation_stages(decoder)
    output = [stage for stage in stages if stage.name in ("output layer", "deep output")]
    maps_of = maps_function(["attention", "gradient"])
    trained = maps_of(decoder)
    fresh = fresh_parameters(decoder, seed=2018)
    after = maps_of(randomised(decoder, output, fresh))
    assert torch.equal(after["attention"], trained["attention"])
    assert not torch.allclose(after["gradient"], trained["gradient"])
    result = randomisation_test(decoder, maps_of, word_mask(decoder), GRID, 32)
    for measure in MEASURES:
        for index in range(len(output)):
            assert result["cascading"]["attention"][measure][index] == pytest.approx(1.0)
            assert result["independent"]["attention"][measure][index] == pytest.approx(1.0)
        assert result["cascading"]["attention"][measure][-1] < 0.99  # the attention stage changes it
    assert result["cascading"]["gradient"]["spearman_abs"][0] < 0.99


@pytest.mark.parametrize("make", [lstm, transformer], ids=["lstm", "transformer"])
def test_a_method_that_ignores_the_model_stays_similar_at_every_stage(make):
    decoder = make()
    mask = word_mask(decoder)
    annotations = grids()
    inputs = annotations.norm(dim=-1).unsqueeze(1).expand(-1, mask.size(1), -1)  # each cell's feature norm

    def maps_of(model):
        maps = maps_function(["attention"])(model)
        maps["input_norm"] = inputs
        return maps

    result = randomisation_test(decoder, maps_of, mask, GRID, 32, threshold=0.5)
    for variant in ("cascading", "independent"):
        for measure in MEASURES:
            assert result[variant]["input_norm"][measure] == pytest.approx([1.0] * len(result["stages"]))
    assert result["flag"]["input_norm"] is True and result["flag"]["attention"] is False
    assert result["flag"]["measure"] == "spearman_abs"


def test_the_data_randomisation_test_compares_the_two_models_maps():
    trained = torch.rand(2, 3, P, generator=torch.Generator().manual_seed(1))
    shuffled = torch.rand(2, 3, P, generator=torch.Generator().manual_seed(2))
    select = torch.tensor([[True, True, False], [True, False, False]])
    result = data_randomisation_test({"m": trained}, {"m": shuffled}, select, GRID, 32)
    assert result["words"] == 3
    assert result["methods"]["m"] == similarities(trained[select], shuffled[select], GRID, 32)


def records() -> list[ImageRecord]:
    def one(index: int, split: str) -> ImageRecord:
        words = (f"word{index}", split)
        return ImageRecord(index, Path(f"{index}.png"), split, (words,), (" ".join(words),))

    return [
        one(i, split) for i, split in enumerate(["train", "val", "train", "train", "test", "train", "train"])
    ]


def test_shuffled_captions_permute_the_training_split_alone_and_follow_the_seed():
    original = records()
    shuffled = shuffled_captions(original, "train", seed=4)
    train = [index for index, record in enumerate(original) if record.split == "train"]
    for before, after in zip(original, shuffled, strict=True):
        assert (after.image_id, after.path, after.split) == (before.image_id, before.path, before.split)
        if before.split != "train":
            assert after == before
    # the same captions, each pair (tokens, raw) kept together, moved between training images
    moved = [(shuffled[i].captions, shuffled[i].raw) for i in train]
    assert sorted(moved) == sorted((original[i].captions, original[i].raw) for i in train)
    permutation = np.random.default_rng(4).permutation(len(train))
    assert [shuffled[i].captions for i in train] == [original[train[k]].captions for k in permutation]
    assert shuffled_captions(original, "train", seed=4) == shuffled
    assert shuffled_captions(original, "train", seed=5) != shuffled
