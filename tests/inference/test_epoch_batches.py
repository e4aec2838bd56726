"""The batches of an epoch (``captioning/inference/batches.py``): an order that depends on the seed
and the epoch alone, so that a resumed run and every process of a group see the same batches."""

from __future__ import annotations

from captioning.inference.batches import EpochBatches


def test_the_order_is_the_seed_and_epochs_and_a_resume_starts_batches_in():
    first = EpochBatches(23, 5, seed=1, epoch=2).batches
    assert first == EpochBatches(23, 5, seed=1, epoch=2).batches  # nothing else changes it
    assert first != EpochBatches(23, 5, seed=1, epoch=3).batches  # another epoch, another order
    assert sorted(i for batch in first for i in batch) == list(range(23))  # every image once
    assert [len(batch) for batch in first] == [5, 5, 5, 5, 3]
    assert EpochBatches(23, 5, seed=1, epoch=2, skip=3).batches == first[3:]
    assert EpochBatches(7, 3, seed=0, epoch=0, shuffle=False).batches == [[0, 1, 2], [3, 4, 5], [6]]


def test_processes_share_every_global_batch():
    whole = EpochBatches(21, 6, seed=4, epoch=1).batches
    shares = [EpochBatches(21, 6, seed=4, epoch=1, rank=rank, world_size=3).batches for rank in range(3)]
    for step, batch in enumerate(whole):
        assert sorted(i for share in shares for i in share[step]) == sorted(batch)
