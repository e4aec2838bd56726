"""Encoder weights: one resolution for ``pretrained`` / a file path / ``none``, and the files behind them.

``resolve_weights`` turns ``model.encoder.weights`` into a local file (or none) and its identity;
each family then loads that file its own way (torchvision: a strict state dict; timm and open_clip:
through the library, which converts and resizes what it needs). Published files come from the
torch hub cache (torchvision, plain URLs) or the Hugging Face cache (timm, open_clip), and are
downloaded there when missing, with a bounded timeout: offline, the error comes within seconds as
one line naming the file, where it comes from and where to put it (the Hugging Face host is probed
with one short connect first, since huggingface_hub retries an unreachable host for about a minute).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.hub
from torch import nn

from captioning.models.encoders.registry import EncoderWeightsError
from captioning.utils.files import not_a_regular_file
from captioning.utils.state_files import StateFileError, read_state_file

DOWNLOAD_TIMEOUT_S = 15.0  # socket timeout while fetching published weights
PROBE_TIMEOUT_S = 3.0  # connect timeout of the reachability probe before a Hugging Face download


@dataclass(frozen=True)
class ResolvedWeights:
    """``model.encoder.weights`` resolved.

    Attributes:
        path: the file to load; None for random initialisation (``none``).
        identity: what identifies these weights in fingerprints (plain JSON types).
    """

    path: Path | None
    identity: dict[str, Any]


def file_identity(path: Path) -> dict[str, Any]:
    """A weights file's identity: its size and the sha256 of its content.

    Not its path or modification time: a moved, copied or reinstalled file with the same bytes
    gives the same features, so it must keep the same feature cache (hashing takes well under a
    second even for ResNet-152's 230 MB).
    """
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return {"size": path.stat().st_size, "sha256": digest.hexdigest()}


def resolve_weights(
    weights: str,
    published: Callable[[], Path],
    published_identity: Callable[[Path], dict[str, Any]],
    setting: str = "model.encoder.weights",
) -> ResolvedWeights:
    """``weights`` ("pretrained" | "none" | a file path) as a file to load and its identity.

    Args:
        weights: the configured value.
        published: returns the published weights file (from a cache, or downloaded there).
        published_identity: the identity of the published file (e.g. torchvision's weights name).
        setting: the configuration key, for error messages.
    Raises:
        EncoderWeightsError: the published file cannot be had, or the path is not a regular file.
    """
    if weights == "none":
        return ResolvedWeights(None, {"none": True})
    if weights == "pretrained":
        path = published()
        return ResolvedWeights(path, published_identity(path))
    path = Path(weights).expanduser()
    if not path.is_file():
        raise EncoderWeightsError(
            f"{weights}: {not_a_regular_file(path) or 'encoder weights file not found'} "
            f"({setting} takes pretrained, none or a file path)"
        )
    return ResolvedWeights(path, file_identity(path))


@contextlib.contextmanager
def _socket_timeout(seconds: float) -> Iterator[None]:
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(previous)


def unreachable(url: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why ``url``'s host (or the proxy the environment routes it through) takes no connection, else None.

    One TCP connect bounded by ``timeout``: no request is sent, so it answers in seconds where a
    library's retries and backoff would take a minute.
    """
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if proxy and not urllib.request.proxy_bypass(host):
        proxy_parts = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host, port = proxy_parts.hostname or "", proxy_parts.port or 80
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as error:
        return f"{host}:{port} unreachable: {error.strerror or str(error) or type(error).__name__}"


def url_file(url: str, label: str) -> Path:
    """The file at ``url`` in the torch hub cache (``<hub>/checkpoints``), downloading it there if missing.

    Args:
        url: where the weights are published.
        label: what they are, for the error message (e.g. ``ResNet101_Weights.IMAGENET1K_V2``).
    """
    path = Path(torch.hub.get_dir()) / "checkpoints" / url.rsplit("/", 1)[-1]
    if path.is_file():
        return path
    match = torch.hub.HASH_REGEX.search(path.name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # a read-only or odd hub folder is an OSError too
        with _socket_timeout(DOWNLOAD_TIMEOUT_S):
            torch.hub.download_url_to_file(
                url, str(path), hash_prefix=match.group(1) if match else None, progress=True
            )
    except (OSError, urllib.error.URLError, RuntimeError) as error:  # offline, timeout, bad hash
        reason = str(getattr(error, "reason", error)).replace("\n", " ")
        raise EncoderWeightsError(
            f"pretrained weights {label} not found: {path.name} is not in the torch hub cache and "
            f"downloading {url} failed ({reason}); download it and put it at {path}, or train offline on the "
            f"packaged EfficientNet-Lite0 weights: model.encoder.name=efficientnet_lite0 (for COCO: "
            f"--config configs/coco_lite0.yaml)"
        ) from None
    return path


def hub_file(
    repo_id: str, filenames: Sequence[str], label: str, setting: str = "model.encoder.weights"
) -> Path:
    """A published file of a Hugging Face repository: the first of ``filenames`` in the local cache,
    else the first that downloads (timm and open_clip publish there).

    The cache is looked at before any network call; downloads are skipped under ``HF_HUB_OFFLINE=1``
    or when the hub's host takes no connection within ``PROBE_TIMEOUT_S`` (``unreachable``), and
    bounded by ``DOWNLOAD_TIMEOUT_S`` otherwise, so an offline machine gets the error in seconds.

    Args:
        repo_id: e.g. ``timm/vit_base_patch16_clip_224.openai``.
        filenames: the names the library would load, preferred first.
        label: what the weights are, for the error message.
        setting: the configuration key a local file can be given to.
    """
    import huggingface_hub  # a dependency of timm and open_clip_torch, the only callers
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    repo, _, revision = repo_id.strip("/").partition("@")
    for filename in filenames:
        cached = huggingface_hub.try_to_load_from_cache(repo, filename, revision=revision or None)
        if isinstance(cached, str):
            return Path(cached)
    reasons = []
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")
    if offline or huggingface_hub.constants.HF_HUB_OFFLINE:
        reasons.append("HF_HUB_OFFLINE is set")
    elif (why := unreachable(huggingface_hub.constants.ENDPOINT)) is not None:
        reasons.append(why)
    else:
        for filename in filenames:
            try:
                with _socket_timeout(DOWNLOAD_TIMEOUT_S):
                    return Path(
                        huggingface_hub.hf_hub_download(
                            repo, filename, revision=revision or None, etag_timeout=DOWNLOAD_TIMEOUT_S
                        )
                    )
            except LocalEntryNotFoundError as error:  # a subclass of the next, raised when the network fails
                reasons.append(f"{filename}: {type(error).__name__}: {error}".replace("\n", " ")[:160])
                break
            except EntryNotFoundError as error:  # not published under this name
                reasons.append(f"{filename}: {type(error).__name__}".replace("\n", " "))
            except Exception as error:  # offline, timeout, refused: the next name would wait too
                reasons.append(f"{filename}: {type(error).__name__}: {error}".replace("\n", " ")[:160])
                break
    url = huggingface_hub.hf_hub_url(repo, filenames[0], revision=revision or None)
    raise EncoderWeightsError(
        f"pretrained weights {label} not found: {filenames[0]} of {repo} is not in the Hugging Face cache "
        f"({huggingface_hub.constants.HF_HUB_CACHE}) and downloading it failed ({'; '.join(reasons)}); "
        f"download {url} and set {setting} to its path, or run `hf download {repo} {filenames[0]}` "
        "where there is a network and copy the cache here"
    )


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """A state dict from a ``torch.save`` file (weights_only) or a ``.safetensors`` file
    (``read_state_file``).

    Raises:
        EncoderWeightsError: the file cannot be read, or holds something other than a state dict.
    """
    try:
        state = read_state_file(path, "state-dict file")
    except StateFileError as error:
        raise EncoderWeightsError(str(error)) from None
    if not isinstance(state, dict):
        raise EncoderWeightsError(f"{path}: expected a state dict, found a {type(state).__name__}")
    return state


def load_state_dict(
    model: nn.Module,
    path: Path,
    adapt: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None,
) -> None:
    """Load ``path`` into ``model`` strictly; a mismatch names a few missing/unexpected keys.

    Args:
        adapt: applied to the file's state dict before the check (e.g. interpolating position
            embeddings); it must leave a state dict it does not recognise as it is.
    """
    state = read_state_dict(path)
    if adapt is not None:
        state = adapt(state)
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    wrong_shape = [k for k in expected if k in state and state[k].shape != expected[k].shape]
    if missing or unexpected or wrong_shape:
        parts = [
            f"{label} {len(keys)} ({', '.join(keys[:4])}{', ...' if len(keys) > 4 else ''})"
            for label, keys in (
                ("missing", missing),
                ("unexpected", unexpected),
                ("wrong shape", wrong_shape),
            )
            if keys
        ]
        raise EncoderWeightsError(f"{path}: weights do not fit {type(model).__name__}: " + "; ".join(parts))
    model.load_state_dict(state, strict=True)


def library_error(path: Path, name: str, error: Exception) -> EncoderWeightsError:
    """A library's failure to load ``path`` into ``name`` as one line."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return EncoderWeightsError(f"{path}: weights do not fit {name} ({first[:300]})")
