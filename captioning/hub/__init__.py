"""Saved models: checkpoints written by ``train.py`` (``checkpoint``), and model folders
(``model.safetensors``, ``config.json``, ``vocab.json``, ``README.md``): read (``model_folder``),
written (``save``) and described (``model_card``)."""
