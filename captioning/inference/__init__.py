"""Running a trained captioner: loading it from a checkpoint or model folder and captioning records
(``captioner``), a split's inputs checked and read as datasets over cached grids or images
(``inputs``), and batched decoding of a dataset (``batches``). What the Python API, evaluation,
training's validation, the figures and the demo share."""
