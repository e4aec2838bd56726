"""A trained captioner without PyTorch's networks: ONNX graphs of the encoder and of one decoder step
(``graphs``), written beside the vocabulary and configuration as an export folder (``folder``:
``model.export(folder, format="onnx")``), and captioned through ONNX Runtime with the project's own
search (``runtime``: ``captioning.load(folder, runtime="onnxruntime")``)."""
