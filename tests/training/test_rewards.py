"""The self-critical reward: CIDEr-D with the end of the caption counted as a word."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from captioning.config import DecodeConfig, LSTMDecoderConfig, TrainConfig
from captioning.config.loading import load_config
from captioning.data.vocab import Vocabulary
from captioning.evaluation.metrics import CiderDScorer, EvaluationInputError
from captioning.models.decoder import ShowAttendTellDecoder
from captioning.training.engine import scst_loss
from captioning.training.rewards import END_WORD, CiderDReward

SURFER = 0  # the image whose captions are compared
CUT = ["a", "man", "riding", "a", "wave", "on", "top", "of", "a"]
COMPLETE = ["a", "man", "riding", "a", "wave", "on", "top", "of", "a", "surfboard"]


def coco_like_corpus(images: int = 300, seed: int = 0) -> dict[int, list[list[str]]]:
    """Five captions per image in the way COCO's are written, many of them ending "on top of a ...";
    the surfer's references agree up to "on top of a" and then name what the man rides differently."""
    rng = random.Random(seed)
    subjects = ["a man", "a woman", "a boy", "a girl", "a person", "a dog", "a surfer", "a child"]
    actions = [
        "riding a wave",
        "sitting",
        "standing",
        "laying",
        "walking",
        "jumping",
        "holding a kite",
        "playing",
    ]
    places = [
        "on top of a surfboard",
        "on top of a bench",
        "on top of a table",
        "on top of a bed",
        "on top of a hill",
        "on top of a car",
        "in front of a building",
        "next to a tree",
        "in the water",
        "on a beach",
    ]
    corpus = {}
    for image in range(images):
        subject, action, place = rng.choice(subjects), rng.choice(actions), rng.choice(places)
        corpus[image] = [
            f"{rng.choice([subject, rng.choice(subjects)])} {action} {place}".split() for _ in range(5)
        ]
    corpus[SURFER] = [
        f"a man riding a wave on top of a {end}".split()
        for end in ("surfboard", "wave", "board", "surf board", "big wave")
    ]
    return corpus


def test_a_caption_cut_mid_phrase_scores_below_the_complete_one():
    corpus = coco_like_corpus()
    cut, complete = CiderDReward(corpus)([SURFER, SURFER], [CUT, COMPLETE])
    assert cut < complete - 0.5, (cut, complete)


def test_without_the_end_token_the_cut_caption_wins_as_before():
    # The failure the end token fixes, on the same corpus: what `train.scst_reward_eos=false` keeps.
    cut, complete = CiderDReward(coco_like_corpus(), end_token=False)([SURFER, SURFER], [CUT, COMPLETE])
    assert cut > complete, (cut, complete)


def test_the_end_token_is_a_word_on_both_sides_and_in_the_document_frequencies():
    corpus = coco_like_corpus(images=40, seed=1)
    with_end = {image: [[*words, END_WORD] for words in captions] for image, captions in corpus.items()}
    candidates = [corpus[3][0][:-1], corpus[7][2], ["a", "dog"]]
    expected = CiderDScorer(with_end).scores([3, 7, 9], [[*words, END_WORD] for words in candidates])
    np.testing.assert_allclose(CiderDReward(corpus)([3, 7, 9], candidates), expected, rtol=1e-12)
    # Off: exactly the plain CIDEr-D of the words.
    np.testing.assert_allclose(
        CiderDReward(corpus, end_token=False)([3, 7, 9], candidates),
        CiderDScorer(corpus).scores([3, 7, 9], candidates),
        rtol=1e-12,
    )


def test_a_caption_cut_by_the_length_limit_gets_no_end_token():
    corpus = coco_like_corpus(images=40, seed=2)
    reward = CiderDReward(corpus)
    caption = corpus[5][1]
    finished, unfinished = reward([5, 5], [caption, caption], [True, False])
    with_end = {image: [[*words, END_WORD] for words in captions] for image, captions in corpus.items()}
    assert unfinished == pytest.approx(CiderDScorer(with_end).scores([5], [caption])[0])
    assert finished > unfinished  # the reference's own words, ended where it ends


def test_bad_input_is_refused():
    reward = CiderDReward({1: [["a", "dog"]]})
    with pytest.raises(ValueError, match="2 captions but 1 finished"):
        reward([1, 1], [["a"], ["dog"]], [True])
    with pytest.raises(KeyError, match="image 2"):
        reward([2], [["a"]])
    with pytest.raises(EvaluationInputError, match="image 1 has no references"):
        CiderDReward({1: []})


def test_the_end_token_setting_defaults_on_and_is_a_config_key():
    assert TrainConfig().scst_reward_eos is True
    assert load_config(None, {"train.scst_reward_eos": False}).train.scst_reward_eos is False


def test_the_self_critical_step_tells_the_reward_which_captions_ended():
    torch.manual_seed(0)
    vocab = Vocabulary(["<pad>", "<start>", "<end>", "<unk>", "a", "dog"])
    decoder = ShowAttendTellDecoder.from_config(
        LSTMDecoderConfig(embed_dim=8, hidden_dim=16, attention_dim=8, dropout=0.0), len(vocab), 4
    ).train()
    calls = []

    def rewarder(image_ids, rows, finished):
        calls.append((rows, finished))
        return np.zeros(len(rows))

    class Model:  # the part of Captioner that scst_loss uses
        def __init__(self, decoder):
            self.decoder = decoder

    batch = {"features": torch.randn(2, 3, 4), "image_ids": torch.tensor([1, 2])}
    for end_bias, ended in ((30.0, True), (-30.0, False)):  # a model that always, or never, stops
        with torch.no_grad():
            decoder.out.bias.zero_()
            decoder.out.bias[vocab.end_id] = end_bias
        calls.clear()
        scst_loss(
            Model(decoder),
            batch,
            rewarder,
            TrainConfig(scst_samples=2),
            DecodeConfig(min_length=1, max_length=3, forbid_unk=False),
        )
        for rows, finished in calls:  # the samples, then the greedy baseline
            assert finished == [ended] * len(rows)
            assert all(vocab.end_id not in row for row in rows)
            assert all(len(row) == (1 if ended else 3) for row in rows)
