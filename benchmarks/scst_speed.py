"""The self-critical part of ``speed.py`` (``--parts scst``): one SCST step beside a cross-entropy step.

The step is the trainer's own: ``engine.scst_loss`` (a sampled rollout of ``samples`` captions per
image, the greedy baseline's rollout or the mean of the other samples, the CIDEr-D reward of
``training.rewards.CiderDReward`` with its end token, the policy-gradient loss) and
``engine.optimisation_step`` (backward, gradient clipping at ``train.grad_clip``, Adam step), under
the same autocast. The model is a ``Captioner`` with the reference decoder over cached
(B, P, C) grids, as the self-critical stage runs on a feature cache; its encoder is a stand-in that
never runs. ``<end>`` is made unreachable (output bias -1e4, as the beam part does), so every
rollout runs ``words`` words: the same work on every step, the worst case of a real rollout.

The reward's references are a synthetic corpus of ``corpus_images`` images with ``references``
captions each (words drawn with Zipf-like frequencies over the vocabulary, lengths from
``COCO_WORDS``); its document frequencies come from the whole corpus, once, as the trainer's
``CiderDReward`` is built once per run; the step's images are the corpus's first ones.

``xe_step_ms_B16x5`` is the trainer's cross-entropy step (``engine.train_one_epoch`` over one batch:
teacher forcing, the decoder's objective, ``optimisation_step``) on the same images with as many
captions of ``words`` words (the same number of decoding steps as a rollout).
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from harness import PeakMemory, autocast, median_seconds, synchronize
from loader_speed import LoaderSizes, stand_in_encoder
from selfcritical_baseline import Att2inModel, DecoderSampler, PythonCiderD, self_critical_step

from captioning.config import DecodeConfig, LSTMDecoderConfig, ModelConfig, TrainConfig
from captioning.data.vocab import SPECIALS, Vocabulary
from captioning.models.captioner import Captioner, build_decoder
from captioning.models.decoding import rollout, sampler
from captioning.training.engine import TrainState, optimisation_step, scst_loss, train_one_epoch
from captioning.training.optim import adam
from captioning.training.rewards import CiderDReward


@dataclass(frozen=True)
class ScstSizes:
    """The self-critical step's sizes; the defaults are the reference."""

    images: int = 16
    samples: int = 5  # sampled captions per image (train.scst_samples)
    words: int = 16  # decode.max_length; <end> unreachable, so every caption has this many words
    corpus_images: int = 1_000  # images of the reward's reference corpus (document frequencies)
    references: int = 5  # reference captions per image


QUICK = ScstSizes(images=2, samples=3, words=4, corpus_images=20, references=2)


def vocabulary(size: int) -> Vocabulary:
    """The four special tokens and ``size - 4`` synthetic words ``w4`` ... (ids equal their number)."""
    return Vocabulary([*SPECIALS, *(f"w{i}" for i in range(len(SPECIALS), size))])


def reference_corpus(
    sizes: ScstSizes, vocab: Vocabulary, caption_words: dict[int, float]
) -> dict[int, list[list[str]]]:
    """image id -> ``references`` captions, lengths drawn from ``caption_words`` (words: probability),
    words with frequencies proportional to 1 / rank over the vocabulary's words (a Zipf-like law)."""
    rng = np.random.default_rng(0)
    words = vocab.itos[len(SPECIALS) :]
    frequency = 1.0 / np.arange(1, len(words) + 1)
    frequency /= frequency.sum()
    lengths, weights = list(caption_words), np.array(list(caption_words.values()))
    corpus = {}
    for image_id in range(sizes.corpus_images):
        counts = rng.choice(lengths, size=sizes.references, p=weights / weights.sum())
        corpus[image_id] = [[words[i] for i in rng.choice(len(words), size=n, p=frequency)] for n in counts]
    return corpus


class TimedRewarder:
    """The trainer's rewarder (ids -> words, then ``CiderDReward``), timing each call."""

    def __init__(self, reward: CiderDReward, vocab: Vocabulary):
        self.reward, self.itos = reward, vocab.itos
        self.seconds: list[float] = []

    def __call__(self, ids: Sequence[int], rows: list[list[int]], finished: list[bool]) -> np.ndarray:
        start = time.perf_counter()
        scores = self.reward(ids, [[self.itos[t] for t in row] for row in rows], finished)
        self.seconds.append(time.perf_counter() - start)
        return scores


def timed_steps(
    step: Callable[[], None], rewarder: TimedRewarder, repeats: int, device: torch.device
) -> tuple[float, float]:
    """Median seconds of ``step()`` and of the reward calls within it, after one untimed step."""
    step()
    totals, rewards = [], []
    for _ in range(repeats):
        rewarder.seconds.clear()
        synchronize(device)
        start = time.perf_counter()
        step()
        synchronize(device)
        totals.append(time.perf_counter() - start)
        rewards.append(sum(rewarder.seconds))
    return statistics.median(totals), statistics.median(rewards)


def measure(
    sizes: ScstSizes,
    decoder_config: LSTMDecoderConfig,
    vocab_size: int,
    grid: int,
    channels: int,
    caption_words: dict[int, float],
    device: torch.device,
    repeats: int,
    amp: bool,
) -> dict[str, Any]:
    """Milliseconds of the SCST step (greedy and mean baselines), of its reward and rollout, and of
    the cross-entropy step on as many captions; ``scst_over_xe`` is their ratio."""
    torch.manual_seed(0)
    vocab = vocabulary(vocab_size)
    decoder = build_decoder(decoder_config, vocab_size, channels, (grid, grid))
    with torch.no_grad():
        decoder.out.bias[Vocabulary.end_id] = -1e4
    model = Captioner(
        stand_in_encoder(LoaderSizes(side=grid, channels=channels)),
        decoder,
        vocab,
        ModelConfig(decoder=decoder_config),
    ).to(device)
    model.encoder.requires_grad_(False)
    start = time.perf_counter()
    reward = CiderDReward(reference_corpus(sizes, vocab, caption_words), end_token=True)
    results: dict[str, Any] = {"scst_reward_build_s": time.perf_counter() - start}
    rewarder = TimedRewarder(reward, vocab)
    generator = torch.Generator().manual_seed(4)
    features = torch.rand(sizes.images, grid * grid, channels, generator=generator).to(device)
    batch = {"features": features, "image_ids": torch.arange(sizes.images, device=device)}
    decode = DecodeConfig(max_length=sizes.words)
    train = TrainConfig(scst_samples=sizes.samples, scst_baseline="greedy", amp="bf16" if amp else "none")
    pristine = copy.deepcopy(model.decoder.state_dict())

    def scst_step(config: TrainConfig, optimizer: torch.optim.Optimizer) -> None:
        with autocast(device, amp):
            loss, _ = scst_loss(model, batch, rewarder, config, decode)
        optimisation_step(loss, model, optimizer, config, None, "the benchmark")

    model.train()
    for key, baseline in (("scst_step_ms", "greedy"), ("scst_step_ms_mean_baseline", "mean")):
        model.decoder.load_state_dict(pristine)
        optimizer = adam(model.decoder.parameters(), lr=train.scst_lr)
        config = replace(train, scst_baseline=baseline)
        with PeakMemory(device) as memory:
            step_seconds, reward_seconds = timed_steps(
                lambda config=config, optimizer=optimizer: scst_step(config, optimizer),
                rewarder,
                repeats,
                device,
            )
        results[key] = step_seconds * 1e3
        if baseline == "greedy":
            results["scst_reward_ms"] = reward_seconds * 1e3
            results["scst_peak_mem_mb"] = memory.mib
        else:
            results["scst_reward_ms_mean_baseline"] = reward_seconds * 1e3
    del optimizer

    def sample() -> None:  # the step's sampled rollout, with its autograd graph
        with autocast(device, amp):
            rollout(
                model.decoder,
                features,
                sampler(decode),
                decode,
                repeats=sizes.samples,
            )

    def greedy() -> None:  # the greedy baseline's rollout (eval mode, no graph)
        model.decoder.eval()
        with torch.no_grad(), autocast(device, amp):
            rollout(
                model.decoder,
                features,
                lambda lp: lp.argmax(1),
                decode,
            )
        model.decoder.train()

    results["scst_sample_ms"] = median_seconds(sample, repeats, device) * 1e3
    results["scst_greedy_ms"] = median_seconds(greedy, repeats, device) * 1e3

    # The cross-entropy step on the same images, ``samples`` captions of ``words`` words each.
    model.decoder.load_state_dict(pristine)
    optimizer = adam(model.decoder.parameters(), lr=train.lr)
    tokens = sizes.words + 2  # <start> + words + <end>
    captions = torch.randint(
        len(SPECIALS), vocab_size, (sizes.images, sizes.samples, tokens), generator=generator
    )
    captions[..., 0], captions[..., -1] = Vocabulary.start_id, Vocabulary.end_id
    xe_batch = {
        **batch,
        "captions": captions.to(device),
        "lengths": torch.full((sizes.images, sizes.samples), tokens, device=device),
    }

    def xe_step() -> None:  # one batch through the trainer's own cross-entropy step
        train_one_epoch(
            model,
            [xe_batch],
            optimizer,
            train,
            TrainState(),
            device,
            decoder_config=decoder_config,
            progress=False,
        )

    with PeakMemory(device) as memory:
        xe_seconds = median_seconds(xe_step, repeats, device)
    results["xe_step_ms_B16x5"] = xe_seconds * 1e3  # named by the reference sizes (see scst_sizes)
    results["xe_peak_mem_mb"] = memory.mib
    results["scst_over_xe"] = results["scst_step_ms"] / results["xe_step_ms_B16x5"]
    results["scst_reward_share"] = results["scst_reward_ms"] / results["scst_step_ms"]
    return results


def selfcritical(
    sizes: ScstSizes,
    decoder_config: LSTMDecoderConfig,
    vocab_size: int,
    grid: int,
    channels: int,
    caption_words: dict[int, float],
    device: torch.device,
    repeats: int,
) -> dict[str, Any]:
    """Milliseconds of the framework's self-critical step (``selfcritical_baseline``) at the same
    sizes (grids' shapes, samples, words, vocabulary, reference corpus with words as the ids its
    reward sees): with its Att2in model, and with our reference decoder driven its way."""
    vocab = vocabulary(vocab_size)
    corpus = reference_corpus(sizes, vocab, caption_words)
    generator = torch.Generator().manual_seed(4)
    grids = torch.rand(sizes.images, grid * grid, channels, generator=generator).to(device)
    results: dict[str, Any] = {}
    for key, end in (
        ("selfcritical_scst_step_ms", 0),
        ("selfcritical_scst_step_ms_our_decoder", Vocabulary.end_id),
    ):
        torch.manual_seed(0)
        as_ids = {
            image: [" ".join(str(vocab.stoi[word]) for word in ref) + f" {end}" for ref in refs]
            for image, refs in corpus.items()
        }
        scorer = PythonCiderD(as_ids)
        if end == 0:
            model: Att2inModel | DecoderSampler = Att2inModel(vocab_size, channels).to(device)
        else:
            decoder = build_decoder(decoder_config, vocab_size, channels, (grid, grid)).to(device)
            with torch.no_grad():
                decoder.out.bias[Vocabulary.end_id] = -1e4
            model = DecoderSampler(decoder, Vocabulary.start_id, Vocabulary.end_id)
        optimizer = torch.optim.Adam(model.parameters(), lr=2e-5)
        references = [as_ids[image] for image in range(sizes.images)]

        def step(model=model, optimizer=optimizer, scorer=scorer, references=references, end=end) -> None:
            # words + 1 steps: the words and the step where <end> may follow them, as our rollout runs
            self_critical_step(
                model, optimizer, scorer, grids, references, sizes.samples, sizes.words + 1, end
            )

        results[key] = median_seconds(step, repeats, device) * 1e3
        del model, optimizer
    return results
