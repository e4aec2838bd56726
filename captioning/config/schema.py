"""Typed, frozen configuration for every part of the pipeline.

The configuration is a tree of dataclasses (``Config`` -> ``DataConfig``, ``EncoderConfig``, ...).
It is filled from a YAML file, overridden from the command line with dotted keys
(``train.lr=2e-4``), validated at construction, saved beside the outputs and stored in every
checkpoint as plain Python types, so a checkpoint rebuilds its model with no other file (reading
and writing: :mod:`captioning.config.loading`).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any

from captioning.registry import FamilyRegistry
from captioning.utils.errors import ConfigError


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


@dataclass(frozen=True)
class PathOption:
    """The marker of an option that names a file or folder, declared on its type
    (``split_file: FilePath | None``, ``annotations: tuple[FilePath, ...]``): wherever it is read, a
    leading ``~`` is expanded as a shell does, and a data option that ``must_exist`` is checked before
    any work (``captioning.data.readers.check_data_paths``). A reader of your own marks its own the
    same way."""

    kind: str  # file | folder
    must_exist: bool = True  # False: a place the project writes, or a name that may be a path


FilePath = Annotated[str, PathOption("file")]  # a file that must exist
FolderPath = Annotated[str, PathOption("folder")]  # a folder that must exist
OutputFolder = Annotated[str, PathOption("folder", must_exist=False)]  # a folder written, made if need be
NameOrFile = Annotated[str, PathOption("file", must_exist=False)]  # a name, or a path to a file


def path_options(cls: type) -> dict[str, PathOption]:
    """The fields of a section class that name files or folders (alone, in a tuple or optional), with
    their markers, by field name."""
    if cls not in _PATHS:
        hints = typing.get_type_hints(cls, include_extras=True)
        found = {item.name: _marker(hints[item.name]) for item in dataclasses.fields(cls)}
        _PATHS[cls] = {name: marker for name, marker in found.items() if marker is not None}
    return _PATHS[cls]


def _marker(hint: Any) -> PathOption | None:
    if typing.get_origin(hint) is Annotated:
        return next((extra for extra in hint.__metadata__ if isinstance(extra, PathOption)), None)
    return next(filter(None, map(_marker, typing.get_args(hint))), None)


_PATHS: dict[type, dict[str, PathOption]] = {}
_HINTS: dict[type, dict[str, Any]] = {}


def _type_hints(cls: type) -> dict[str, Any]:
    """A section class's resolved field types, once per class (every construction checks them)."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


# The 32-bit floats every option that reaches a tensor becomes: a smaller magnitude is 0 or a subnormal
# (top_p 1e-300 would keep no word), a larger one inf.
FLOAT32_TINY = 1.1754943508222875e-38  # numpy.finfo(numpy.float32).tiny
FLOAT32_MAX = 3.4028234663852886e38  # numpy.finfo(numpy.float32).max


def check_float32(value: float, key: str) -> None:
    """Refuse a finite ``value`` that is neither 0 nor a normal 32-bit float (NaN and inf are each
    option's own check), naming ``key``."""
    if math.isfinite(value) and value != 0 and not FLOAT32_TINY <= abs(value) <= FLOAT32_MAX:
        raise ConfigError(
            f"{key} must be 0 or of magnitude in [{FLOAT32_TINY:.4g}, {FLOAT32_MAX:.4g}], the "
            f"32-bit floats it is used as, got {value!r}"
        )


def _check_types(section: object, prefix: str) -> None:
    """Every field of ``section`` holds its declared type (a configuration built in Python, e.g. by the
    API's ``beam_size=2.5``, is refused here as a file's would be when it is read): ``int`` fields an
    int (not a bool), ``float`` fields a finite-or-not real number that is 0 or a normal 32-bit float
    (the type options become in tensors), ``bool`` fields a bool, ``str`` fields a str."""
    hints = _type_hints(type(section))
    for item in dataclasses.fields(section):  # type: ignore[arg-type]
        value, hint = getattr(section, item.name), hints.get(item.name)
        key = prefix + item.name
        if hint is int and (not isinstance(value, int) or isinstance(value, bool)):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
        if hint is float and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise ConfigError(f"{key} must be a number, got {value!r}")
        if hint is float:
            check_float32(value, key)
        if hint is bool and not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {value!r}")
        if hint is str and not isinstance(value, str):
            raise ConfigError(f"{key} must be a string, got {value!r}")


SCHEDULES = ("none", "step", "plateau", "noam", "cosine")
PER_STEP_SCHEDULES = ("noam", "cosine")  # the others step once per epoch
# CHAIR's word tables: the authors' released table and rules, or this project's extended one.
CHAIR_TABLES = ("released", "extended")


def _one_of(name: str, value: Any, choices: tuple) -> None:
    _check(value in choices, f"{name} must be one of {', '.join(map(str, choices))}, got {value!r}")


def _check_family(section: Any, families: FamilyRegistry) -> None:
    """``section`` is an instance of the options class its family's name (``section.kind``,
    ``section.dataset``) chooses."""
    name = getattr(section, families.field)
    expected = families.config_class(name)
    if expected is None:
        raise ConfigError(families.unknown_message(name))
    _check(
        type(section) is expected,
        f"{families.key} {name!r} is configured by {expected.__name__}, not {type(section).__name__}",
    )


MAX_CAPTION_LENGTH = 500  # data.max_caption_length: words a stored caption may hold


@dataclass(frozen=True)
class DataConfig:
    """Where the captions and images come from and how captions become token ids: what every dataset
    reader shares; a reader with options of its own adds them in a subclass registered in
    ``DATASETS`` (``ShapesDataConfig``: the Shapes generator's; ``KarpathyDataConfig`` and
    ``CocoDataConfig``: the caption files the karpathy and coco readers read)."""

    dataset: str = "shapes"  # a reader: shapes | karpathy | coco | imagefolder | folder | webdataset | yours
    root: FolderPath = "data/shapes"  # images (Karpathy: filepath/filename; webdataset: .tar folder, pattern)
    instances: tuple[FilePath, ...] = ()  # COCO instances JSON files with boxes, for attention grounding
    chair_table: str = "released"  # CHAIR's words: released (Rohrbach et al.'s) | extended (this project's)
    pointing_tolerance: float = 15.0  # pixels: the published pointing game's hit radius (Zhang et al. 2016)
    min_word_count: int = 5  # words seen fewer times in train become <unk>
    tokenizer: str = "ptb"  # a registered tokenizer (captioning.data.tokenizers.TOKENIZERS); ptb is English's
    max_caption_length: int = 20  # words per caption, without <start>/<end>; longer ones are cut
    skip_bad_images: bool = False  # skip (and count) unreadable images instead of stopping
    num_workers: int = 0  # DataLoader worker processes
    cache_dir: OutputFolder | None = None  # feature cache; None: <data.root>/features (shards': theirs)
    use_cache: bool = True  # cache frozen-encoder features on disk (ignored when fine-tuning)
    shuffle_captions: bool = False  # train split's captions permuted across its images (data randomisation)
    shuffle_captions_seed: int = 0  # the permutation of data.shuffle_captions (same seed, same permutation)

    def __post_init__(self) -> None:
        _check_types(self, "data.")
        _check_family(self, DATASETS)
        _check(
            isinstance(self.tokenizer, str) and 0 < len(self.tokenizer.strip()) <= 200,
            f"data.tokenizer must name a tokenizer, got {self.tokenizer!r:.60}"
            + (f" ({len(self.tokenizer)} characters)" if isinstance(self.tokenizer, str) else ""),
        )  # which names exist is the tokenizer registry's (captioning.data.tokenizers.TOKENIZERS)
        _one_of("data.chair_table", self.chair_table, CHAIR_TABLES)
        _check(
            0 < self.pointing_tolerance <= 10**6,
            f"data.pointing_tolerance must be a number of pixels in (0, 1e6], got {self.pointing_tolerance}",
        )
        _check(self.min_word_count >= 1, f"data.min_word_count must be >= 1, got {self.min_word_count}")
        _check(
            1 <= self.max_caption_length <= MAX_CAPTION_LENGTH,
            f"data.max_caption_length must be in [1, {MAX_CAPTION_LENGTH}] (each caption is stored at this "
            f"length, {MAX_CAPTION_LENGTH} is decode.max_length's bound), got {self.max_caption_length}",
        )
        _check(self.num_workers >= 0, "data.num_workers must be >= 0")


# The dataset readers with options of their own: data.dataset -> its configuration class (the
# built-in ones' below: shapes, karpathy, coco), and the reader attached when the data package
# registers it (``captioning.data.readers.register_reader``, which a reader of your own uses too:
# docs/extending.md). A reader without options of its own (imagefolder, folder, webdataset), or a
# name no reader registered (refused where the data are read), is configured by DataConfig.
DATASETS: FamilyRegistry[DataConfig] = FamilyRegistry(
    "dataset reader", key="data.dataset", base=DataConfig, shared=True
)


MAX_SHAPES_IMAGES = 1_000_000  # data.shapes_train/val/test: images a split of Shapes is generated with
MAX_SHAPES_SIDE = 2048  # data.shapes_image_size: pixels (12 MB of RGB an image at the bound)


@DATASETS.register_options("shapes")
@dataclass(frozen=True)
class ShapesDataConfig(DataConfig):
    """Shapes, the built-in synthetic dataset, generated under ``data.root`` (docs/shapes.md)."""

    dataset: str = "shapes"
    shapes_seed: int = 0  # generator seed (same seed, same bytes)
    shapes_train: int = 2000  # training images
    shapes_val: int = 200  # validation images
    shapes_test: int = 200  # test images
    shapes_image_size: int = 224  # image side in pixels
    shapes_max_objects: int = 3  # at most this many objects per image (1-3)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(1 <= self.shapes_max_objects <= 3, "data.shapes_max_objects must be 1, 2 or 3")
        _check(
            min(self.shapes_train, self.shapes_val, self.shapes_test) >= 1,
            "data.shapes_train/val/test must be >= 1",
        )
        for name in ("shapes_train", "shapes_val", "shapes_test"):
            count = getattr(self, name)
            _check(
                count <= MAX_SHAPES_IMAGES, f"data.{name} must be at most {MAX_SHAPES_IMAGES:,}, got {count}"
            )
        _check(
            32 <= self.shapes_image_size <= MAX_SHAPES_SIDE,
            f"data.shapes_image_size must be in [32, {MAX_SHAPES_SIDE}], got {self.shapes_image_size}",
        )
        _check(
            0 <= self.shapes_seed < 2**63,
            f"data.shapes_seed must be in [0, 2**63) (numpy's seeds), got {self.shapes_seed}",
        )


SHAPE_CLASSES = ("circle", "square", "triangle", "diamond")  # the shapes Shapes draws (its categories)


@DATASETS.register_options("shapes_hallucination")
@dataclass(frozen=True)
class ShapesHallucinationDataConfig(ShapesDataConfig):
    """Shapes with a co-occurrence prior that its test split breaks: a testbed where a captioner names
    objects that are not there, with every object's box (docs/shapes.md, "A testbed for hallucination")."""

    dataset: str = "shapes_hallucination"
    root: FolderPath = "data/shapes_hallucination"
    shapes_cause: str = "circle"  # the class the partner comes with in train and val
    shapes_partner: str = "square"  # small and partly under the cause; never in a test image with it
    shapes_prior: float = 0.95  # P(partner | cause) in train and val (test: 0)
    shapes_cause_share: float = 0.5  # train and val images holding the cause (test: all)
    shapes_covered: float = 0.5  # mean share of the partner's (test: the decoy's) pixels the cause covers
    shapes_partner_side: float = 0.13  # the partner's side / the image's (a small shape: 0.20)
    shapes_decoy: float = 0.5  # test images with a small shape of a third class where the partner would be

    def __post_init__(self) -> None:
        super().__post_init__()
        _one_of("data.shapes_cause", self.shapes_cause, SHAPE_CLASSES)
        _one_of("data.shapes_partner", self.shapes_partner, SHAPE_CLASSES)
        _check(
            self.shapes_max_objects >= 2, "data.shapes_max_objects must be 2 or 3 (the cause and its partner)"
        )
        _check(
            self.shapes_cause != self.shapes_partner, "data.shapes_partner must differ from data.shapes_cause"
        )
        for name in ("shapes_prior", "shapes_cause_share", "shapes_decoy"):
            value = getattr(self, name)
            _check(0.0 <= value <= 1.0, f"data.{name} must be a share in [0, 1], got {value}")
        _check(
            0.0 <= self.shapes_covered <= 0.8,
            f"data.shapes_covered must be in [0, 0.8], got {self.shapes_covered}",
        )
        _check(
            0.05 <= self.shapes_partner_side <= 0.2,
            f"data.shapes_partner_side must be in [0.05, 0.2], got {self.shapes_partner_side}",
        )


@dataclass(frozen=True)
class KarpathySplitConfig(DataConfig):
    """The options of a reader of Karpathy's split file (``dataset_coco.json``, ...), shared by the
    karpathy and coco readers' options classes (not itself a reader's: a reader of your own that reads
    the split file derives its options class from it)."""

    split_file: FilePath | None = None  # Karpathy split JSON (dataset_coco.json, ...); coco: optional
    restval_to_train: bool = True  # Karpathy's 'restval' images join 'train'


@DATASETS.register_options("karpathy")
@dataclass(frozen=True)
class KarpathyDataConfig(KarpathySplitConfig):
    """Karpathy's split file ``data.split_file`` (COCO, Flickr8k, Flickr30k: docs/coco.md), which the
    karpathy reader requires, images under ``data.root``."""

    dataset: str = "karpathy"


@DATASETS.register_options("coco")
@dataclass(frozen=True)
class CocoDataConfig(KarpathySplitConfig):
    """The official COCO caption files ``data.annotations``, images under ``data.root``; each image's
    split is Karpathy's when ``data.split_file`` is given, else its file's (docs/coco.md)."""

    dataset: str = "coco"
    annotations: tuple[FilePath, ...] = ()  # COCO caption annotation files (captions_train2014.json, ...)


# The built-in readers without options of their own are known here too, so that a configuration read
# before the data package is imported does not take them for readers of a module not imported.
for _name in ("imagefolder", "folder", "webdataset"):
    DATASETS.register_options(_name)(DataConfig)
del _name


# Upper bounds on the sizes a configuration (a user's, a checkpoint's or a model folder's) may ask for,
# checked before any tensor is allocated: far above any published captioning model (widths of 512 to
# 2048, images of 224 to 576 pixels), far below a size whose allocation fails or overflows.
MAX_DECODER_SIZE = 16384  # embedding, hidden, attention and feed-forward widths, heads and layers
MAX_IMAGE_SIZE = 4096  # model.encoder.image_size in pixels


@dataclass(frozen=True)
class EncoderConfig:
    """The CNN that turns an image into a grid of annotation vectors."""

    name: str = "efficientnet_lite0"  # a name from captioning.models.encoders.ENCODERS
    weights: NameOrFile = "pretrained"  # pretrained | none | path to a state-dict file
    image_size: int = 224  # images resized to a square of this side, no crop (the grid covers the image)
    grid_size: int = 0  # 0 keeps the native grid; else adaptive pooling to grid_size x grid_size
    fine_tune_stages: int = 0  # last N stages trained; 0 = frozen (features can be cached)

    def __post_init__(self) -> None:
        _check_types(self, "model.encoder.")
        _check(
            32 <= self.image_size <= MAX_IMAGE_SIZE,
            f"model.encoder.image_size must be in [32, {MAX_IMAGE_SIZE}], got {self.image_size}",
        )
        _check(self.grid_size >= 0, f"model.encoder.grid_size must be >= 0, got {self.grid_size}")
        _check(self.fine_tune_stages >= 0, "model.encoder.fine_tune_stages must be >= 0")


@dataclass(frozen=True)
class DecoderConfig:
    """What every caption decoder has; each family (a registered ``kind``) adds its own options."""

    kind: str = "lstm"  # a registered decoder: lstm (Show, Attend and Tell) | transformer
    dropout: float = 0.5  # LSTM: before the output layer; Transformer: embeddings and every residual branch
    doubly_stochastic: float = 1.0  # lambda of equation 14, both terms per caption (docs/training.md)

    def __post_init__(self) -> None:
        _check_types(self, "model.decoder.")
        _check_family(self, DECODERS)
        _check(0.0 <= self.dropout < 1.0, f"model.decoder.dropout must be in [0, 1), got {self.dropout}")
        _check(
            math.isfinite(self.doubly_stochastic) and self.doubly_stochastic >= 0,
            f"model.decoder.doubly_stochastic must be finite and >= 0, got {self.doubly_stochastic}",
        )

    def _positive(self, *names: str) -> None:
        """Each size at least 1 and at most MAX_DECODER_SIZE (the model is then built in memory)."""
        for name in names:
            value = getattr(self, name)
            _check(
                1 <= value <= MAX_DECODER_SIZE,
                f"model.decoder.{name} must be in [1, {MAX_DECODER_SIZE}], got {value}",
            )


# The decoder families: model.decoder.kind -> its configuration class, and the decoder class attached
# when the models package registers it (``captioning.models.base.register_decoder``, which a decoder
# of your own uses too: docs/extending.md). The built-in families' options are registered here, where
# configurations are read.
DECODERS: FamilyRegistry[DecoderConfig] = FamilyRegistry(
    "decoder", key="model.decoder.kind", base=DecoderConfig
)


@DECODERS.register_options("lstm")
@dataclass(frozen=True)
class LSTMDecoderConfig(DecoderConfig):
    """The attention LSTM of Show, Attend and Tell (soft or hard attention)."""

    kind: str = "lstm"
    attention: str = "soft"  # soft (section 4.2) | hard (stochastic, section 4.1)
    scoring: str = "additive"  # a registered attention scorer (captioning.models.attention.SCORERS)
    activation: str = "tanh"  # additive scoring non-linearity: tanh (paper) | relu (tutorial)
    num_heads: int = 8  # heads of the multihead scorer
    embed_dim: int = 512  # word embedding size
    hidden_dim: int = 512  # LSTM size
    attention_dim: int = 512  # attention projection size
    gate: str = "scalar"  # scalar (paper's beta_t) | channel (tutorial) | none
    deep_output: bool = True  # equation 7; False gives a plain linear output over h_t
    init_layers: int = 1  # layers of the h_0/c_0 MLP; 2 as the authors' COCO script (C->C ReLU)
    output_tanh: bool = False  # tanh over equation 7's sum before the output layer (authors' code)
    hidden_dropout: bool = False  # dropout on h_t before L_h too (authors' code; deep output only)
    annotation_layers: int = 1  # additive scoring: 2 adds an A->A tanh layer (authors' n_layers_att=2)
    # Hard attention (equation 12: REINFORCE with a moving-average baseline and an entropy bonus).
    hard_reinforce: float = 1.0  # hard attention: lambda_r, weight of the REINFORCE term
    hard_entropy: float = 0.002  # hard attention: lambda_e, weight of the entropy bonus
    hard_baseline_decay: float = 0.9  # hard attention: decay of the moving-average reward baseline
    hard_expected_prob: float = 0.5  # hard attention: probability of the expected context instead of a sample
    # caption: each caption draws its own (the paper's semi-sampling); minibatch: one draw for the whole
    # minibatch, as capgen.py's h_sampling_mask (the authors' code); docs/training.md
    hard_expected_draw: str = "caption"  # hard attention: caption | minibatch (one draw per pass)
    # paper: every term's gradient reaches alpha_t (equation 12 plus equation 14's penalty); authors: only
    # REINFORCE's and the entropy's, as capgen.py's known_grads (no gradient from the penalty or through
    # the expected context); docs/training.md
    hard_alpha_gradients: str = "paper"  # hard attention: paper | authors (the penalty without gradient)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._positive(
            "embed_dim", "hidden_dim", "attention_dim", "num_heads", "init_layers", "annotation_layers"
        )
        _check(
            self.annotation_layers == 1 or self.scoring == "additive",
            "model.decoder.annotation_layers > 1 needs model.decoder.scoring additive",
        )
        _check(
            not self.hidden_dropout or self.deep_output,
            "model.decoder.hidden_dropout needs model.decoder.deep_output",
        )
        _one_of("model.decoder.hard_alpha_gradients", self.hard_alpha_gradients, ("paper", "authors"))
        _one_of("model.decoder.hard_expected_draw", self.hard_expected_draw, ("caption", "minibatch"))
        _one_of("model.decoder.attention", self.attention, ("soft", "hard"))
        _one_of("model.decoder.activation", self.activation, ("tanh", "relu"))
        _one_of("model.decoder.gate", self.gate, ("scalar", "channel", "none"))
        _check(
            not self.output_tanh or self.deep_output,
            "model.decoder.output_tanh needs model.decoder.deep_output",
        )
        for name in ("hard_reinforce", "hard_entropy"):
            value = getattr(self, name)
            _check(
                math.isfinite(value) and value >= 0,
                f"model.decoder.{name} must be finite and >= 0, got {value}",
            )
        _check(0.0 <= self.hard_expected_prob <= 1.0, "model.decoder.hard_expected_prob must be in [0, 1]")
        _check(0.0 <= self.hard_baseline_decay < 1.0, "model.decoder.hard_baseline_decay must be in [0, 1)")


@DECODERS.register_options("transformer")
@dataclass(frozen=True)
class TransformerDecoderConfig(DecoderConfig):
    """The Transformer decoder over the same grid (docs/transformer.md)."""

    kind: str = "transformer"
    num_heads: int = 8  # attention heads of every block
    d_model: int = 512  # model width (embeddings, attention, residual stream)
    d_ff: int = 2048  # inner size of the feed-forward blocks
    encoder_layers: int = 3  # self-attention blocks over the grid, once per image; 0 = none
    decoder_layers: int = 3  # decoder blocks (self-attention, cross-attention, feed-forward)
    pre_norm: bool = False  # LayerNorm before each sublayer instead of after (the original)
    tie_embeddings: bool = True  # the output layer shares the word embedding matrix

    def __post_init__(self) -> None:
        super().__post_init__()
        self._positive("num_heads", "d_model", "d_ff", "decoder_layers")
        _check(
            self.encoder_layers >= 0, f"model.decoder.encoder_layers must be >= 0, got {self.encoder_layers}"
        )
        _check(
            self.d_model % self.num_heads == 0,
            f"model.decoder.d_model ({self.d_model}) must be divisible by model.decoder.num_heads "
            f"({self.num_heads})",
        )


@dataclass(frozen=True)
class ModelConfig:
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    decoder: DecoderConfig = field(default_factory=LSTMDecoderConfig)  # its class follows decoder.kind


# Words of a generated caption at most: COCO's longest reference has about 50; past a few hundred a
# decode is a runaway (every step costs a decoder pass, and each word keeps its attention map).
MAX_DECODE_LENGTH = 500
DECODE_STRATEGIES = ("greedy", "beam", "sample")  # captioning.models.decoding.STRATEGIES


@dataclass(frozen=True)
class DecodeConfig:
    """How captions are generated at validation, test and visualization time."""

    strategy: str = field(default="beam", metadata={"choices": DECODE_STRATEGIES})  # greedy | beam | sample
    beam_size: int = 3  # hypotheses kept per image
    max_length: int = 20  # words, without <end>
    min_length: int = 0  # <end> is forbidden before this many words
    length_alpha: float = 0.0  # GNMT length normalisation ((5 + len) / 6) ** alpha; 0 = none
    block_trigrams: bool = False  # forbid a trigram from appearing twice in one caption
    temperature: float = 1.0  # sampling and self-critical rollouts: the logits are divided by this
    top_k: int = 0  # sampling and self-critical rollouts: the k most likely words only; 0 = all
    top_p: float = 1.0  # sampling and self-critical rollouts: the nucleus of this mass only; 1 = all
    beam_groups: int = 1  # diverse beam search: groups of beam_size / beam_groups beams; 1 = plain
    diversity: float = 0.0  # diverse beam search: cost of a word an earlier group chose at this step
    repetition_penalty: float = 1.0  # logit of a said word / this (x if negative); beam: log-prob x this
    num_return: int = 1  # captions per image, ranked (beam: <= beam_size; sample: distinct draws)
    forbid_unk: bool = True  # never emit <unk> (validation, test, figures and self-critical rollouts)
    batch_size: int = 50  # images decoded at once

    def __post_init__(self) -> None:
        _check_types(self, "decode.")
        _one_of("decode.strategy", self.strategy, DECODE_STRATEGIES)
        _check(self.beam_size >= 1, f"decode.beam_size must be >= 1, got {self.beam_size}")
        _check(
            1 <= self.max_length <= MAX_DECODE_LENGTH,
            f"decode.max_length must be in [1, {MAX_DECODE_LENGTH}], got {self.max_length}",
        )
        _check(0 <= self.min_length <= self.max_length, "decode.min_length must be in [0, max_length]")
        _check(
            0 <= self.length_alpha <= 10, f"decode.length_alpha must be in [0, 10], got {self.length_alpha}"
        )
        # Logits are divided by it: far below 1e-3 they overflow to inf and sampling gives NaN.
        _check(
            1e-3 <= self.temperature <= 1e3,
            f"decode.temperature must be in [0.001, 1000], got {self.temperature}",
        )
        _check(self.top_k >= 0, "decode.top_k must be >= 0")
        _check(0 < self.top_p <= 1, f"decode.top_p must be in (0, 1], got {self.top_p}")
        _check(
            self.beam_groups >= 1 and self.beam_size % self.beam_groups == 0,
            f"decode.beam_groups must be >= 1 and divide decode.beam_size ({self.beam_size}), "
            f"got {self.beam_groups}",
        )
        _check(0 <= self.diversity <= 1e3, f"decode.diversity must be in [0, 1000], got {self.diversity}")
        _check(
            0.01 <= self.repetition_penalty <= 100,
            f"decode.repetition_penalty must be in [0.01, 100], got {self.repetition_penalty}",
        )
        _check(self.num_return >= 1, f"decode.num_return must be >= 1, got {self.num_return}")
        _check(
            self.num_return == 1 or self.strategy != "greedy",
            f"decode.num_return {self.num_return} needs decode.strategy beam or sample (greedy gives one)",
        )
        _check(
            self.strategy != "beam" or self.num_return <= self.beam_size,
            f"decode.num_return ({self.num_return}) must be at most decode.beam_size ({self.beam_size})",
        )
        _check(self.batch_size >= 1, "decode.batch_size must be >= 1")


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation: cross-entropy stage, then optionally self-critical."""

    output_dir: OutputFolder = "runs/shapes"  # checkpoints, logs, results and figures go here
    overwrite: bool = False  # another run's outputs in output_dir are deleted; else refused
    resume: str = "none"  # none | auto: continue from output_dir's checkpoints/last.pt if there is one
    epochs: int = 4  # cross-entropy epochs
    batch_size: int = 32  # images per batch (each brings all its captions)
    captions_per_image: int = 5  # captions of an image used per step (seq_per_img)
    lr: float = 4e-4  # decoder learning rate (Adam), cross-entropy stage
    encoder_lr: float = 1e-4  # used when model.encoder.fine_tune_stages > 0
    weight_decay: float = 0.0  # Adam weight decay
    adam_beta2: float = 0.999  # Adam's second-moment decay (Transformer recipes use 0.98)
    grad_clip: float = 5.0  # max gradient norm; 0 disables
    label_smoothing: float = 0.0  # cross-entropy label smoothing
    ema_decay: float = 0.0  # validate and keep a moving average of the weights (e.g. 0.998); 0 = off
    schedule: str = "plateau"  # none | step | plateau (per epoch) | noam | cosine (per step, after warm-up)
    warmup_steps: int = 4000  # noam, cosine: steps of linear warm-up to train.lr
    step_size: int = 3  # epochs between decays (step)
    gamma: float = 0.8  # decay factor (step and plateau)
    plateau_patience: int = 2  # epochs without improvement before a plateau decay
    early_stop_patience: int = 5  # epochs without improvement of `metric`; 0 disables
    metric: str = "CIDEr-D"  # validation metric for the best checkpoint and early stopping (Java-less)
    val_images: int = 0  # validate on the first N validation images; 0 = all
    seed: int = 0  # seeds Python, NumPy, torch and the batch order
    deterministic: bool = False  # deterministic algorithms (exact resume on CPU)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    amp: str = "none"  # none | bf16 (GPU or CPU) | fp16 (GPU): autocast in training and validation
    compile: bool = False  # torch.compile the decoder step (helps on GPU; slow to compile on CPU)
    checkpoint_every: int = 0  # also checkpoint every N steps; 0 = once per epoch
    nonfinite: str = "stop"  # stop | skip: what a non-finite loss does
    max_steps: int = 0  # stop after N optimisation steps in total (tests, smoke runs); 0 = no limit
    log_every: int = 20  # TensorBoard scalars every N steps
    # Self-critical sequence training (Rennie et al. 2017), after the cross-entropy epochs.
    scst_epochs: int = 0  # self-critical epochs after the cross-entropy epochs
    scst_lr: float = 2e-5  # self-critical stage's rate (a fine-tuned encoder's: encoder_lr * scst_lr / lr)
    scst_baseline: str = "greedy"  # greedy | mean (mean reward of the other samples)
    scst_samples: int = 5  # sampled captions per image
    scst_reward_eos: bool = True  # the CIDEr-D reward counts <end> (Rennie et al.); false: the older reward
    # The faithfulness study of the test split after scoring it (evaluate.py --faithfulness's defaults):
    # its table in test_scores.json, its page in test_faithfulness.html (docs/attention-and-report.md).
    faithfulness: bool = False  # end the run with the study
    faithfulness_images: int = 0  # explain the first N test images; 0 = all
    faithfulness_methods: str = "default"  # comma-separated methods; default: all that fit the model
    faithfulness_pixel_steps: int = 0  # also RISE's pixel-space curves in N steps; 0 = the grid's only

    def __post_init__(self) -> None:
        _check_types(self, "train.")
        _check(self.epochs >= 0, f"train.epochs must be >= 0, got {self.epochs}")
        _check(self.batch_size >= 1, f"train.batch_size must be >= 1, got {self.batch_size}")
        _check(self.captions_per_image >= 1, "train.captions_per_image must be >= 1")
        for name in ("lr", "encoder_lr", "scst_lr"):
            _check(getattr(self, name) > 0, f"train.{name} must be > 0, got {getattr(self, name)}")
        _check(self.weight_decay >= 0, "train.weight_decay must be >= 0")
        _check(0.0 <= self.adam_beta2 < 1.0, f"train.adam_beta2 must be in [0, 1), got {self.adam_beta2}")
        _check(self.grad_clip >= 0, "train.grad_clip must be >= 0")
        _check(0.0 <= self.label_smoothing < 1.0, "train.label_smoothing must be in [0, 1)")
        _check(0.0 <= self.ema_decay < 1.0, f"train.ema_decay must be in [0, 1), got {self.ema_decay}")
        _one_of("train.schedule", self.schedule, SCHEDULES)
        _check(self.warmup_steps >= 1, f"train.warmup_steps must be >= 1, got {self.warmup_steps}")
        _check(self.step_size >= 1, "train.step_size must be >= 1")
        _check(0 < self.gamma <= 1, "train.gamma must be in (0, 1]")
        _check(self.early_stop_patience >= 0, "train.early_stop_patience must be >= 0")
        _one_of("train.resume", self.resume, ("none", "auto"))
        _check(0 <= self.seed < 2**32, f"train.seed must be in [0, 2**32 - 1], got {self.seed}")
        _one_of("train.amp", self.amp, ("none", "bf16", "fp16"))
        _one_of("train.nonfinite", self.nonfinite, ("stop", "skip"))
        _one_of("train.scst_baseline", self.scst_baseline, ("greedy", "mean"))
        _check(self.scst_samples >= 1, f"train.scst_samples must be >= 1, got {self.scst_samples}")
        _check(
            self.scst_samples >= 2 or self.scst_baseline == "greedy",
            "train.scst_samples must be >= 2 with the mean baseline",
        )
        for name in (
            "checkpoint_every",
            "max_steps",
            "val_images",
            "scst_epochs",
            "faithfulness_images",
            "faithfulness_pixel_steps",
        ):
            _check(getattr(self, name) >= 0, f"train.{name} must be >= 0")
        _check(self.log_every >= 1, "train.log_every must be >= 1")


@dataclass(frozen=True)
class Config:
    """The whole configuration of a run."""

    data: DataConfig = field(default_factory=ShapesDataConfig)  # its class follows data.dataset
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)


def to_dict(config: Any) -> dict[str, Any]:
    """A configuration dataclass as nested plain dicts/lists (for YAML, JSON and checkpoints)."""

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, tuple):
            return [plain(v) for v in value]
        return value

    return plain(config)


def reward_description(train: TrainConfig) -> str:
    """The self-critical reward a training configuration uses: ``cider-d.eos`` or ``cider-d.noeos``."""
    return "cider-d.eos" if train.scst_reward_eos else "cider-d.noeos"
