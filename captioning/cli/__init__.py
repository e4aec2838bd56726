"""The command lines behind the three top-level scripts and the live demo.

``common`` is what they share (configuration flags, ``--set``, ``--import``, one-line errors and
``run_cli``); ``train`` is the main job of ``train.py``, ``evaluate`` the modes of ``evaluate.py``,
``visualize`` the figures of ``visualize.py`` and ``serve`` its ``--serve`` demo.
"""
