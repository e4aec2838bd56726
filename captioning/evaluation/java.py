"""The Java half of the official metrics, run with a time limit and never writing inside an installed package.

pycocoevalcap's ``PTBTokenizer`` writes its temporary file next to its own module (inside
site-packages) and waits for Java without a limit. :func:`ptb_tokenize` runs the same jar with
the same command line, with its temporary file in a temporary folder of ours, under a timeout.
:func:`meteor_score` runs pycocoevalcap's METEOR under a timeout too. Either raises
:class:`JavaTimeout`, and the caller falls back to the Java-less path as when Java is missing.
"""

from __future__ import annotations

import subprocess
import tempfile
import threading
from pathlib import Path

from captioning.data.caption_text import replace_lone_surrogates
from captioning.utils.errors import CaptioningError, RunError

DEFAULT_TIMEOUT_S = 600.0  # the COCO test split (5,000 images) takes well under a minute per call
# The punctuation tokens pycocoevalcap's PTBTokenizer removes after tokenizing.
_PUNCTUATION = frozenset(
    ["''", "'", "``", "`", "-LRB-", "-RRB-", "-LCB-", "-RCB-", ".", "?", "!", ",", ":", "-", "--", "...", ";"]
)


class JavaTimeout(CaptioningError, RuntimeError):
    """A Java scorer did not answer within its time limit (the process has been killed)."""


def ptb_tokenize(captions: dict[int, list[str]], timeout: float = DEFAULT_TIMEOUT_S) -> dict[int, list[str]]:
    """Tokenize as pycocoevalcap's ``PTBTokenizer.tokenize`` does (Stanford CoreNLP 3.4.1, lower case,
    punctuation removed), one line per caption.

    Args:
        captions: image id -> captions (line breaks inside a caption must already be spaces).
        timeout: seconds to wait for Java.
    Returns:
        image id -> tokenized captions, in the same order.
    Raises:
        JavaTimeout: Java did not finish in ``timeout`` seconds.
        RuntimeError: Java failed, or returned another number of lines.
    """
    from pycocoevalcap.tokenizer import ptbtokenizer

    jar = Path(ptbtokenizer.__file__).resolve().parent / ptbtokenizer.STANFORD_CORENLP_3_4_1_JAR
    image_ids = [image_id for image_id, texts in captions.items() for _ in texts]
    # Lone surrogates cannot be written as UTF-8; they are replaced (U+FFFD) like any undecodable byte.
    lines = [
        replace_lone_surrogates(text).replace("\n", " ") for texts in captions.values() for text in texts
    ]
    with tempfile.TemporaryDirectory(prefix="captioning-ptb-") as folder:
        source = Path(folder) / "captions.txt"
        source.write_text("\n".join(lines), encoding="utf-8")
        command = [
            "java",
            "-cp",
            str(jar),
            "edu.stanford.nlp.process.PTBTokenizer",
            "-preserveLines",
            "-lowerCase",
            str(source),
        ]
        try:
            finished = subprocess.run(command, capture_output=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise JavaTimeout(f"the PTB tokenizer (Java) did not finish in {timeout:g} s") from None
    if finished.returncode != 0:
        detail = finished.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no message"]
        raise RunError(f"the PTB tokenizer (Java) failed with exit status {finished.returncode}: {detail[0]}")
    output = finished.stdout.decode("utf-8", "replace").split("\n")
    if len(output) < len(lines) or any(output[len(lines) :]):
        raise RuntimeError("the PTB tokenizer returned a different number of captions than it was given")
    tokenized: dict[int, list[str]] = {image_id: [] for image_id in captions}
    for image_id, line in zip(image_ids, output, strict=False):
        tokenized[image_id].append(
            " ".join(word for word in line.rstrip().split(" ") if word not in _PUNCTUATION)
        )
    return tokenized


def meteor_score(
    gts: dict[int, list[str]], res: dict[int, list[str]], timeout: float = DEFAULT_TIMEOUT_S
) -> tuple[float, list[float]]:
    """pycocoevalcap's METEOR 1.5 (Java) over tokenized captions, killed after ``timeout`` seconds.

    Raises:
        JavaTimeout: METEOR did not answer in time.
    """
    from pycocoevalcap.meteor.meteor import Meteor

    meteor = Meteor()
    scores: list[tuple[float, list[float]]] = []
    errors: list[BaseException] = []

    def compute() -> None:
        try:
            scores.append(meteor.compute_score(gts, res))
        except BaseException as error:  # re-raised in the calling thread
            errors.append(error)

    worker = threading.Thread(target=compute, daemon=True)
    worker.start()
    worker.join(timeout)
    try:
        if worker.is_alive():
            raise JavaTimeout(f"METEOR (Java) did not finish in {timeout:g} s")
        if errors:
            raise errors[0]
        return scores[0]
    finally:
        meteor.meteor_p.kill()  # end the Java process now (it also unblocks a worker still reading)
        meteor.meteor_p.wait()
        worker.join(5)
        if meteor.lock.locked():  # compute_score failed holding it: Meteor.__del__ would wait forever
            meteor.lock.release()
