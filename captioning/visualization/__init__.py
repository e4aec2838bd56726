"""Attention visualisation: overlays, Show-Attend-Tell figures and the interactive HTML report.

The only package that imports matplotlib (always on the Agg canvas, never a window). Import the
modules themselves; this file imports nothing, so ``visualize.py`` can check its inputs before
torch and matplotlib are loaded.

- ``overlay``: ``upsample_attention`` stretches attention grids onto image pixels; ``colorize`` and
  ``blend`` colour-map them and alpha-blend them over the image.
- ``figures``: ``attention_figure`` (the image, then one panel per word) and ``save_figure``.
- ``report``: ``write_report`` (one self-contained HTML page), ``write_figures`` and
  ``write_figures_and_report`` (the training run's closing pictures).
- ``api``: ``visualize_images``, what ``visualize.py`` runs.
"""
