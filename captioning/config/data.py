"""The ``data`` section: what every dataset reader shares (``DataConfig``), the registry of readers'
options classes (``DATASETS``) and the built-in readers' own options (Shapes, its hallucination
testbed, Karpathy's split file, the COCO caption files)."""

from __future__ import annotations

from dataclasses import dataclass

from captioning.config.fields import (
    FilePath,
    FolderPath,
    OutputFolder,
    check,
    check_family,
    check_types,
    one_of,
)
from captioning.registry import FamilyRegistry

__all__ = [
    "CHAIR_TABLES",
    "DATASETS",
    "MAX_CAPTION_LENGTH",
    "MAX_SHAPES_IMAGES",
    "MAX_SHAPES_SIDE",
    "SHAPE_CLASSES",
    "CocoDataConfig",
    "DataConfig",
    "KarpathyDataConfig",
    "KarpathySplitConfig",
    "ShapesDataConfig",
    "ShapesHallucinationDataConfig",
]

# CHAIR's word tables: the authors' released table and rules, or this project's extended one.
CHAIR_TABLES = ("released", "extended")

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
        check_types(self, "data.")
        check_family(self, DATASETS)
        check(
            isinstance(self.tokenizer, str) and 0 < len(self.tokenizer.strip()) <= 200,
            f"data.tokenizer must name a tokenizer, got {self.tokenizer!r:.60}"
            + (f" ({len(self.tokenizer)} characters)" if isinstance(self.tokenizer, str) else ""),
        )  # which names exist is the tokenizer registry's (captioning.data.tokenizers.TOKENIZERS)
        one_of("data.chair_table", self.chair_table, CHAIR_TABLES)
        check(
            0 < self.pointing_tolerance <= 10**6,
            f"data.pointing_tolerance must be a number of pixels in (0, 1e6], got {self.pointing_tolerance}",
        )
        check(self.min_word_count >= 1, f"data.min_word_count must be >= 1, got {self.min_word_count}")
        check(
            1 <= self.max_caption_length <= MAX_CAPTION_LENGTH,
            f"data.max_caption_length must be in [1, {MAX_CAPTION_LENGTH}] (each caption is stored at this "
            f"length, {MAX_CAPTION_LENGTH} is decode.max_length's bound), got {self.max_caption_length}",
        )
        check(self.num_workers >= 0, "data.num_workers must be >= 0")


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
        check(1 <= self.shapes_max_objects <= 3, "data.shapes_max_objects must be 1, 2 or 3")
        check(
            min(self.shapes_train, self.shapes_val, self.shapes_test) >= 1,
            "data.shapes_train/val/test must be >= 1",
        )
        for name in ("shapes_train", "shapes_val", "shapes_test"):
            count = getattr(self, name)
            check(
                count <= MAX_SHAPES_IMAGES, f"data.{name} must be at most {MAX_SHAPES_IMAGES:,}, got {count}"
            )
        check(
            32 <= self.shapes_image_size <= MAX_SHAPES_SIDE,
            f"data.shapes_image_size must be in [32, {MAX_SHAPES_SIDE}], got {self.shapes_image_size}",
        )
        check(
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
        one_of("data.shapes_cause", self.shapes_cause, SHAPE_CLASSES)
        one_of("data.shapes_partner", self.shapes_partner, SHAPE_CLASSES)
        check(
            self.shapes_max_objects >= 2, "data.shapes_max_objects must be 2 or 3 (the cause and its partner)"
        )
        check(
            self.shapes_cause != self.shapes_partner, "data.shapes_partner must differ from data.shapes_cause"
        )
        for name in ("shapes_prior", "shapes_cause_share", "shapes_decoy"):
            value = getattr(self, name)
            check(0.0 <= value <= 1.0, f"data.{name} must be a share in [0, 1], got {value}")
        check(
            0.0 <= self.shapes_covered <= 0.8,
            f"data.shapes_covered must be in [0, 0.8], got {self.shapes_covered}",
        )
        check(
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
