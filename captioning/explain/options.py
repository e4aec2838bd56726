"""The study that ends a training run (``train.faithfulness``), its settings checked before training."""

from __future__ import annotations

from captioning.config import Config
from captioning.explain.config import ExplainConfig
from captioning.registry import UnknownNameError
from captioning.utils.errors import ConfigError, InputError


def run_settings(config: Config) -> ExplainConfig | None:
    """The study that ends a training run (``train.faithfulness``), checked before training: the methods
    registered, able to explain the configured decoder and their library installed. None when the
    switch is off.

    Raises:
        ConfigError: naming the ``train.faithfulness_*`` key and the entry.
    """
    train = config.train
    if not train.faithfulness:
        return None
    from captioning.explain.methods import applicable_methods, check_extras, parse_methods
    from captioning.models.base import decoder_class

    # a throwaway decoder of the configured family answers which methods fit it (sizes do not matter)
    decoder = decoder_class(config.model.decoder.kind).from_config(config.model.decoder, 8, 8, (2, 2))
    try:
        if train.faithfulness_methods.strip() == "default":
            methods = applicable_methods(decoder)
        else:
            methods = parse_methods(train.faithfulness_methods, decoder)
        check_extras(methods, "train.faithfulness_methods")
        return ExplainConfig(
            methods=methods,
            pointing_tolerance=config.data.pointing_tolerance,
            pixel_steps=train.faithfulness_pixel_steps,
        )
    except (InputError, UnknownNameError) as error:
        message = str(error).replace("--method", "train.faithfulness_methods")
        raise ConfigError(
            message if "train." in message else f"train.faithfulness_methods: {message}"
        ) from None
