"""A trained captioner without PyTorch's networks: ONNX graphs of the encoder and of one decoder step
(``graphs``, named in ``layout``), written beside the vocabulary and configuration as an export folder
(``writing``: ``model.export(folder, format="onnx")``; read and checked by ``folder``), and captioned
through ONNX Runtime over NumPy arrays without torch (``runtime``, ``search``, ``beam``, ``model``:
``captioning.load(folder, runtime="onnxruntime")``), or as a PyTorch ``Captioner`` for the
command-line tools (``bridge``)."""
