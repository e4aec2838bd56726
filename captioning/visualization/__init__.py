"""Attention visualisation: overlays, Show-Attend-Tell figures and the interactive HTML report.

The only package that imports matplotlib (always on the Agg canvas, never a window). Import the
modules themselves; this file imports nothing, so ``visualize.py`` can check its inputs before
torch and matplotlib are loaded.

- ``overlay``: ``upsample_attention`` stretches attention grids onto image pixels; ``display_range``
  (one colour scale per figure, or per word), ``attention_statistics`` (peak and entropy);
  ``colorize`` and ``blend`` colour-map maps and alpha-blend them over the image.
- ``figures``: ``attention_figure`` (the image, then one panel per word, a colour bar, each word's
  peak and entropy, ground-truth boxes) and ``save_figure``.
- ``fonts``: ``font_families`` (matplotlib's default font, then the installed CJK fonts) and
  ``font_note`` (one line naming the characters no installed font draws, with the fix).
- ``report``: ``write_report`` (the self-contained attention viewer of ``visualize.py --html``),
  and ``write_figures`` (one figure per image).
- ``run_report``: ``write_run_report``, the training run's ``report.html`` (configuration, scores,
  curves, a sortable table of the test images that open their attention).
- ``api``: ``visualize_images``, what ``visualize.py`` runs.
"""
