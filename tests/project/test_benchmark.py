"""benchmarks/speed.py runs end to end and reports every promised number; the tutorial baseline is faithful.

No timing is asserted: the numbers depend on the machine and its load.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from search_options import settings
from test_hostile import small_disk  # noqa: F401 - a fixture: a real 4 MiB tmpfs

from captioning.config import LSTMDecoderConfig
from captioning.models.decoder import LSTMState, ShowAttendTellDecoder

ROOT = Path(__file__).resolve().parents[2]
SPEED = ROOT / "benchmarks" / "speed.py"

POSITIVE_NUMBERS = (
    "matmul_peak_gflops",
    "train_step_ms",
    "train_step_gflop",
    "train_gflops",
    "train_mfu",
    "tutorial_train_step_ms",
    "tutorial_train_step_gflop",
    "speedup_train",
    "speedup_beam_1",
    "speedup_beam_3",
    "speedup_beam_5",
    "cache_build_s",
    "cache_epoch_s",
    "stream_epoch_s",
    "cache_speedup",
    "cache_grids_s",
    "stream_grids_s",
    "cache_grids_speedup",
    "encoder_images_per_s",
    "folded_encoder_images_per_s",
    "fold_speedup",
    "coco_step_ms",
    "coco_epoch_s",
    "coco_mean_words",
    *(
        f"{prefix}_{key}"
        for prefix in ("transformer", "transformer6")
        for key in (
            "train_step_ms",
            "train_step_gflop",
            "train_gflops",
            "train_mfu",
            "speedup_beam_1",
            "speedup_beam_3",
            "speedup_beam_5",
        )
    ),
)
BEAM_RATES = (
    "beam_captions_per_s",
    "tutorial_beam_captions_per_s",
    *(
        f"{prefix}_{key}"
        for prefix in ("transformer", "transformer6")
        for key in ("beam_captions_per_s", "recompute_beam_captions_per_s")
    ),
)
MEMORY = (
    "matmul_peak_mem_mb",
    "train_peak_mem_mb",
    "tutorial_train_peak_mem_mb",
    "beam_peak_mem_mb",
    "tutorial_beam_peak_mem_mb",
    "cache_peak_mem_mb",
    "stream_peak_mem_mb",
    *(
        f"{prefix}_{key}"
        for prefix in ("transformer", "transformer6")
        for key in ("train_peak_mem_mb", "beam_peak_mem_mb", "recompute_beam_peak_mem_mb")
    ),
)


def _load_baseline(name: str = "tutorial_baseline"):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def quick_results() -> dict:
    completed = subprocess.run(
        [
            sys.executable,
            str(SPEED),
            "--quick",
            "--json",
            "--coco",
            "--parts",
            "train,beam,cache,transformer",
        ],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout)


@pytest.mark.slow
def test_quick_run_reports_finite_positive_numbers(quick_results):
    for key in POSITIVE_NUMBERS:
        value = quick_results[key]
        assert isinstance(value, float) and math.isfinite(value) and value > 0, (key, value)
    for key in BEAM_RATES:
        assert set(quick_results[key]) == {"1", "3", "5"}
        assert all(math.isfinite(v) and v > 0 for v in quick_results[key].values()), key
    for key in MEMORY:  # a part may fit in memory freed by an earlier one
        assert math.isfinite(quick_results[key]) and quick_results[key] >= 0, key
    assert quick_results["quick"] is True and quick_results["device"] == "cpu"
    # the vector instructions the figures were measured with (bf16 without them is 10x slower)
    from captioning.utils.device import cpu_bf16_instructions

    assert [quick_results["cpu_capability"], quick_results["cpu_bf16_instructions"]] == list(
        cpu_bf16_instructions()
    )


@pytest.mark.slow
def test_quick_run_with_amp_on_cpu_times_the_bf16_step_beside_the_float32_one():
    completed = subprocess.run(
        [sys.executable, str(SPEED), "--quick", "--json", "--amp", "--parts", "train,beam"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads(completed.stdout)
    assert results["amp"] is True and results["device"] == "cpu"
    for key in (
        "matmul_peak_bf16_gflops",
        "train_step_ms",
        "train_step_ms_fp32",
        "amp_train_speedup",
        "train_mfu",
        "train_mfu_fp32",
    ):
        assert isinstance(results[key], float) and math.isfinite(results[key]) and results[key] > 0, key
    # Each MFU is against its own precision's measured peak.
    assert math.isclose(results["train_mfu"], results["train_gflops"] / results["matmul_peak_bf16_gflops"])
    assert math.isclose(
        results["train_mfu_fp32"], results["train_gflops_fp32"] / results["matmul_peak_gflops"]
    )
    assert math.isclose(
        results["amp_train_speedup"], results["train_step_ms_fp32"] / results["train_step_ms"]
    )
    assert set(results["beam_captions_per_s"]) == {"1", "3", "5"}


@pytest.mark.slow
def test_loader_part_reads_a_synthetic_cache_with_0_1_and_2_workers(tmp_path):
    completed = subprocess.run(
        [
            sys.executable,
            str(SPEED),
            "--quick",
            "--json",
            "--parts",
            "loader",
            "--loader-dir",
            str(tmp_path),
            "--loader-images",
            "70",
            "--loader-grid",
            "3x3x16",
        ],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads(completed.stdout)
    assert (results["loader_images"], results["loader_grid"]) == (70, "3x3x16")
    for key in (
        "loader_captions_per_s",
        "loader_mb_per_s",
        "loader_first_pass_captions_per_s",
        "loader_first_pass_mb_per_s",
    ):
        assert set(results[key]) == {"0", "1", "2"}, key
        assert all(math.isfinite(v) and v > 0 for v in results[key].values()), key
    assert list(tmp_path.iterdir()) == []  # the synthetic cache is deleted afterwards


@pytest.mark.slow
def test_loader_part_refuses_a_disk_too_small_before_measuring(small_disk):  # noqa: F811
    completed = subprocess.run(
        [
            sys.executable,
            str(SPEED),
            "--quick",
            "--json",
            "--parts",
            "loader",
            "--loader-dir",
            str(small_disk),
            "--loader-images",
            "1000",
            "--loader-grid",
            "7x7x1280",
        ],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 1 and "Traceback" not in completed.stderr and completed.stdout == ""
    [line] = completed.stderr.strip().splitlines()  # the folder, its room, the need, the two fixes
    assert all(
        name in line
        for name in (f"--loader-dir {small_disk}", "0.0 GB", "1,000 images", "1.2 GB", "--loader-images")
    ), line
    assert list(small_disk.iterdir()) == []


SCST_NUMBERS = (
    "scst_step_ms",
    "scst_step_ms_mean_baseline",
    "scst_reward_ms",
    "scst_sample_ms",
    "scst_greedy_ms",
    "xe_step_ms_B16x5",
    "scst_over_xe",
    "scst_reward_build_s",
    "selfcritical_scst_step_ms",
    "selfcritical_scst_step_ms_our_decoder",
    "speedup_scst",
    "speedup_scst_same_decoder",
)
CAPTION_NUMBERS = (
    "caption_images_per_s",
    "caption_peak_rss_mb",
    "caption_load_s",
    "tutorial_caption_images_per_s",
    "tutorial_caption_peak_rss_mb",
    "speedup_caption",
)


@pytest.mark.slow
def test_scst_and_caption_parts_report_positive_numbers_at_tiny_sizes():
    """A self-critical step and a folder captioned end to end, beside the tutorial's per-image path."""
    completed = subprocess.run(
        [sys.executable, str(SPEED), "--quick", "--json", "--parts", "scst,caption"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads(completed.stdout)
    for key in (*SCST_NUMBERS, *CAPTION_NUMBERS):
        value = results[key]
        assert isinstance(value, float) and math.isfinite(value) and value > 0, (key, value)
    for key in ("scst_peak_mem_mb", "xe_peak_mem_mb", "caption_peak_mem_mb", "tutorial_caption_peak_mem_mb"):
        assert math.isfinite(results[key]) and results[key] >= 0, key
    assert math.isclose(results["scst_over_xe"], results["scst_step_ms"] / results["xe_step_ms_B16x5"])
    assert math.isclose(
        results["speedup_scst"], results["selfcritical_scst_step_ms"] / results["scst_step_ms"]
    )
    assert math.isclose(
        results["speedup_caption"],
        results["caption_images_per_s"] / results["tutorial_caption_images_per_s"],
    )
    # The reward's share of the step is timed inside it.
    assert results["scst_reward_ms"] < results["scst_step_ms"]
    assert results["scst_sizes"]["images"] == 2 and results["caption_sizes"]["images"] == 2


@pytest.mark.slow
def test_shard_startup_reads_the_same_records_headers_cold_and_warm(tmp_path):
    """benchmarks/shard_startup.py at tiny sizes: every start reads every sample; the listings are kept."""
    completed = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "shard_startup.py"),
            *("--shards", "2", "--per-shard", "5", "--repeats", "1", "--json", "--folder", tmp_path),
        ],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads(completed.stdout)
    for mode in ("headers", "cold", "warm"):
        assert results[mode]["images"] == 10 and results[mode]["seconds"] > 0, (mode, results[mode])
    assert results["listings_kib"] > 0
    assert len(list((tmp_path / "cache" / "shard_listings").glob("*.json"))) == 2


@pytest.mark.slow
def test_gpu_check_without_cuda_says_so_in_one_line_and_exits_0():
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py")],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )  # no GPU, even on a machine with one
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.splitlines() == [
        "gpu_check: CUDA is not available on this machine; nothing was run"
    ]
    assert completed.stderr == ""


def test_flop_count_of_the_reference_configuration():
    """The formula by hand for the reference sizes (32 captions x 21 steps, 14x14x2048, 512, V 9490)."""
    sys.path.insert(0, str(SPEED.parent))
    try:
        speed = importlib.import_module("speed")
    finally:
        sys.path.remove(str(SPEED.parent))
    sizes = speed.Sizes()
    projection = 2 * 196 * 2048 * 512
    per_token = 2 * (512 * 2048 + 512 * 512 + 196 * 512 + 196 * 2048 + 512 * 2048 + 2560 * 2048 + 512 * 9490)
    init = 2 * 2 * 2048 * 512
    expected = 3 * (32 * (projection + init) + 32 * 21 * per_token)
    assert speed.train_step_flop(sizes, 32, 32 * 21) == expected
    tutorial = 3 * (32 * 21 * (projection + per_token) + 32 * init)
    assert speed.train_step_flop(sizes, 32, 32 * 21, per_step_projection=True) == tutorial


def _decoders(seed: int = 0):
    torch.manual_seed(seed)
    config = LSTMDecoderConfig(
        scoring="additive",
        activation="relu",
        gate="channel",
        deep_output=False,
        embed_dim=12,
        hidden_dim=10,
        attention_dim=8,
        dropout=0.0,
    )
    ours = ShowAttendTellDecoder.from_config(config, vocab_size=17, annotation_dim=6).eval()
    with torch.no_grad():  # larger weights than the initialisation: captions that differ per image
        for parameter in ours.parameters():
            parameter.mul_(3.0)
    # The tutorial's h_0, c_0 have no tanh; give ours the same start so the two compute one function.
    ours.init_state = lambda a: LSTMState(ours.init_h(a.mean(1)), ours.init_c(a.mean(1)))
    return ours, _load_baseline().TutorialDecoder.from_ours(ours).eval()


def test_tutorial_baseline_computes_our_decoder_given_our_weights():
    ours, tutorial = _decoders()
    annotations = torch.randn(5, 9, 6)
    lengths = torch.tensor([7, 4, 7, 2, 5])
    captions = torch.randint(4, 17, (5, 7))
    with torch.no_grad():
        expected = ours(annotations, captions, lengths)
        logits, _, decode_lengths, alphas, order = tutorial(annotations, captions, lengths)
    mask = expected.mask[order]
    assert decode_lengths == (lengths[order] - 1).tolist()
    torch.testing.assert_close(logits[mask], expected.logits[order][mask], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(alphas[mask], expected.alphas[order][mask], rtol=1e-4, atol=1e-5)


def test_tutorial_beam_search_with_one_beam_is_our_greedy_caption():
    from captioning.models.decoding import greedy_search

    baseline = _load_baseline()
    ours, tutorial = _decoders(seed=1)
    with torch.no_grad():  # make <end> likely enough that some captions end, at varied lengths
        ours.out.bias[2] += 0.5
        tutorial.fc.bias[2] += 0.5
    images = torch.randn(6, 9, 6, generator=torch.Generator().manual_seed(5))
    expected = greedy_search(ours, images, settings(max_length=12))
    assert len({len(caption.tokens) for caption in expected}) >= 3
    for image, caption in zip(images, expected, strict=True):
        found, maps = baseline.tutorial_beam_search(tutorial, image, 1, start_id=1, end_id=2, max_steps=12)
        # Unfinished, the tutorial's loop runs one word past the limit: compare the common words.
        words = len(caption.tokens)
        assert found == caption.tokens if caption.finished else found[:words] == caption.tokens
        torch.testing.assert_close(maps[:words], caption.attention, rtol=1e-4, atol=1e-5)


def _import_benchmark(name: str):
    sys.path.insert(0, str(SPEED.parent))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(SPEED.parent))


def test_transformer_flop_count_of_the_reference_configuration():
    """By hand for 10 images x 5 captions x 21 steps, 14x14x2048, d 512, d_ff 2048, V 9490,
    3+3 and 6+6 layers."""
    transformer_speed = _import_benchmark("transformer_speed")
    sizes = transformer_speed.TransformerSizes()
    p, d = 196, 512
    encoder_block = 8 * p * d * d + 4 * p * p * d + 4 * p * d * 2048
    decoder_block = 8 * 21 * d * d + 4 * 21 * 21 * d + 4 * 21 * d * d + 4 * 21 * p * d + 4 * 21 * d * 2048
    for layers in (3, 6):
        per_image = 2 * p * 2048 * d + layers * (encoder_block + 4 * p * d * d)
        per_caption = layers * decoder_block + 2 * 21 * d * 9490
        expected = 3 * (10 * per_image + 50 * per_caption)
        assert transformer_speed.transformer_train_step_flop(sizes, layers, 10, 50, 21) == expected
    # The grid's work is counted per image, not per caption: 5 captions of one image add only caption work.
    one = transformer_speed.transformer_train_step_flop(sizes, 3, 1, 1, 21)
    five = transformer_speed.transformer_train_step_flop(sizes, 3, 1, 5, 21)
    assert five - one == 4 * 3 * (3 * decoder_block + 2 * 21 * d * 9490)


@pytest.mark.slow
@pytest.mark.parametrize("beam_size", [1, 3])
def test_transformer_beam_search_without_caches_gives_the_cached_captions(beam_size):
    """The recomputing baseline computes the cached decoder's function: the same captions and maps."""
    from captioning.models.decoding import beam_search
    from captioning.models.transformer import TransformerDecoder

    torch.manual_seed(0)
    decoder = TransformerDecoder(
        17, 6, (2, 3), d_model=16, num_heads=4, d_ff=32, encoder_layers=2, decoder_layers=2, dropout=0.1
    ).eval()
    with torch.no_grad():  # <end> likely enough that some captions end and others run to the limit
        decoder.out.bias[2] += 0.5
    recomputing = _load_baseline("recompute_baseline").RecomputingDecoder(decoder)
    grids = torch.randn(8, 6, 6, generator=torch.Generator().manual_seed(5))  # (B, P, C)
    cached = beam_search(decoder, grids, settings(beam_size=beam_size, max_length=12))
    recomputed = beam_search(recomputing, grids, settings(beam_size=beam_size, max_length=12))
    # A case that can tell them apart: captions that differ, end at varied lengths or run to the limit.
    assert len({len(caption.tokens) for caption in cached}) >= 2
    assert len({tuple(caption.tokens) for caption in cached}) >= 3
    assert {caption.finished for caption in cached} == {True, False}
    for ours, baseline in zip(cached, recomputed, strict=True):
        assert baseline.tokens == ours.tokens and baseline.finished == ours.finished
        assert math.isclose(baseline.log_prob, ours.log_prob, rel_tol=1e-5, abs_tol=1e-5)
        torch.testing.assert_close(baseline.attention, ours.attention, rtol=1e-4, atol=1e-5)


def test_the_selfcritical_baseline_rewards_with_our_cider_d_and_learns():
    """The framework's step scores captions as our CiderDReward does (the same reward, computed its
    way: ids as strings with the end token, n-grams counted per call), and its step moves the
    sampled captions' log-probabilities by the advantage."""
    import numpy as np

    from captioning.data.vocab import SPECIALS, Vocabulary
    from captioning.training.rewards import CiderDReward

    baseline = _load_baseline("selfcritical_baseline")
    vocab = Vocabulary([*SPECIALS, *(f"w{i}" for i in range(4, 40))])
    rng = np.random.default_rng(0)
    corpus = {
        image: [[vocab.itos[int(t)] for t in rng.integers(4, 40, size=int(n))] for n in rng.integers(3, 9, 3)]
        for image in range(12)
    }
    as_ids = {
        image: [" ".join(str(vocab.stoi[w]) for w in ref) + " 0" for ref in refs]
        for image, refs in corpus.items()
    }
    captions = [corpus[0][1], [vocab.itos[int(t)] for t in rng.integers(4, 40, size=6)], corpus[2][0][:2]]
    ours = CiderDReward(corpus, end_token=True)([0, 1, 2], captions, [True, True, True])
    theirs = baseline.PythonCiderD(as_ids).score(
        [" ".join(str(vocab.stoi[w]) for w in c) + " 0" for c in captions], [as_ids[i] for i in (0, 1, 2)]
    )
    np.testing.assert_allclose(theirs, ours, rtol=1e-9)
    assert ours[0] > ours[2] > 0  # a reference scores high, a cut one lower: not all zeros

    assert baseline.array_to_str([5, 7, 0, 9]) == "5 7 0"
    torch.manual_seed(0)
    model = baseline.Att2inModel(40, channels=8, embed=8, hidden=8, attention=8)
    grids = torch.rand(2, 4, 8)
    seq, log_probs = model.sample(grids, length=5, samples=3, greedy=False)
    assert seq.shape == log_probs.shape == (6, 5) and bool((seq != 0).all())  # <end> unreachable
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    references = [as_ids[0], as_ids[1]]
    loss = baseline.self_critical_step(
        model, optimizer, baseline.PythonCiderD(as_ids), grids, references, 3, 5
    )
    assert math.isfinite(loss)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))

    # Our decoder driven the framework's way: the same kind of step, our <end> id.
    from captioning.models.captioner import build_decoder

    decoder = build_decoder(LSTMDecoderConfig(embed_dim=8, hidden_dim=8, attention_dim=8), 40, 8, (2, 2))
    sampler = baseline.DecoderSampler(decoder, Vocabulary.start_id, Vocabulary.end_id)
    sampler.eval()  # as the framework's greedy baseline runs: no dropout
    seq, log_probs = sampler.sample(grids, length=5, samples=3, greedy=True)
    assert seq.shape == log_probs.shape == (6, 5)
    assert torch.equal(seq[0], seq[1]) and torch.equal(seq[0], seq[2])  # greedy: one caption per image
    before = [p.detach().clone() for p in decoder.parameters()]
    optimizer = torch.optim.Adam(decoder.parameters(), lr=1e-2)
    as_ours = {
        image: [ref.replace(" 0", f" {Vocabulary.end_id}") for ref in refs] for image, refs in as_ids.items()
    }
    loss = baseline.self_critical_step(
        sampler,
        optimizer,
        baseline.PythonCiderD(as_ours),
        grids,
        [as_ours[0], as_ours[1]],
        3,
        5,
        Vocabulary.end_id,
    )
    assert math.isfinite(loss)
    assert any(not torch.equal(a, b) for a, b in zip(before, decoder.parameters(), strict=True))


def test_json_bound_prints_the_bounds_share_of_each_files_parse(tmp_path):
    """benchmarks/json_bound.py at a tiny scale: a row per written file, with both times and a share."""
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "json_bound.py"), "--scale", "0.002", "--repeats", "1"],
        check=False,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    rows = [line.split() for line in completed.stdout.splitlines()[1:]]
    assert [row[0] for row in rows] == ["instances_like.json", "karpathy_like.json"]
    for _, megabytes, parse, bound, share in rows:
        assert float(megabytes) > 0 and float(parse) > 0 and float(bound) > 0 and share.endswith("%")


@pytest.mark.slow  # trains a tiny run
def test_whole_split_times_the_study_of_a_trained_run(tmp_path):
    """benchmarks/whole_split.py on a tiny trained run: the plan, then the study timed, as JSON."""
    from tiny_models import trained_checkpoint

    checkpoint, _ = trained_checkpoint(tmp_path)
    out = tmp_path / "whole_split.json"
    completed = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "whole_split.py"),
            *("--checkpoint", checkpoint, "--images", "2", "--threads", "1", "--sanity-images", "1"),
            *("--json", out),
        ],
        check=False,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["images"] == 2 and result["words"] >= 2 and result["study_wall_s"] > 0
    assert "n2" in result["settings"].split(",") and set(result["estimated_s"]) >= {"explain", "curves"}
