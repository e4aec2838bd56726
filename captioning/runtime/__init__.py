"""Run machinery beneath training and evaluation: checkpoints, device and seeding, the process group,
the datasets and feature cache a run reads, and batched decoding of a dataset.

Training, evaluation and visualization import from here; nothing here imports from them.
"""
