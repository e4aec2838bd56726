"""The ``decode`` section: how captions are generated at validation, test and visualization time."""

from __future__ import annotations

from dataclasses import dataclass, field

from captioning.config.fields import check, check_types, one_of

__all__ = ["DECODE_STRATEGIES", "MAX_DECODE_LENGTH", "DecodeConfig"]

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
        check_types(self, "decode.")
        one_of("decode.strategy", self.strategy, DECODE_STRATEGIES)
        check(self.beam_size >= 1, f"decode.beam_size must be >= 1, got {self.beam_size}")
        check(
            1 <= self.max_length <= MAX_DECODE_LENGTH,
            f"decode.max_length must be in [1, {MAX_DECODE_LENGTH}], got {self.max_length}",
        )
        check(0 <= self.min_length <= self.max_length, "decode.min_length must be in [0, max_length]")
        check(
            0 <= self.length_alpha <= 10, f"decode.length_alpha must be in [0, 10], got {self.length_alpha}"
        )
        # Logits are divided by it: far below 1e-3 they overflow to inf and sampling gives NaN.
        check(
            1e-3 <= self.temperature <= 1e3,
            f"decode.temperature must be in [0.001, 1000], got {self.temperature}",
        )
        check(self.top_k >= 0, "decode.top_k must be >= 0")
        check(0 < self.top_p <= 1, f"decode.top_p must be in (0, 1], got {self.top_p}")
        check(
            self.beam_groups >= 1 and self.beam_size % self.beam_groups == 0,
            f"decode.beam_groups must be >= 1 and divide decode.beam_size ({self.beam_size}), "
            f"got {self.beam_groups}",
        )
        check(0 <= self.diversity <= 1e3, f"decode.diversity must be in [0, 1000], got {self.diversity}")
        check(
            0.01 <= self.repetition_penalty <= 100,
            f"decode.repetition_penalty must be in [0.01, 100], got {self.repetition_penalty}",
        )
        check(self.num_return >= 1, f"decode.num_return must be >= 1, got {self.num_return}")
        check(
            self.num_return == 1 or self.strategy != "greedy",
            f"decode.num_return {self.num_return} needs decode.strategy beam or sample (greedy gives one)",
        )
        check(
            self.strategy != "beam" or self.num_return <= self.beam_size,
            f"decode.num_return ({self.num_return}) must be at most decode.beam_size ({self.beam_size})",
        )
        check(self.batch_size >= 1, "decode.batch_size must be >= 1")
