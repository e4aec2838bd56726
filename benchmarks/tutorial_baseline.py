"""The popular PyTorch image-captioning tutorial's decoder, re-implemented as the speed baseline.

This is an independent re-implementation of the *algorithm* of the tutorial's
``DecoderWithAttention`` and of its one-image beam search ("a PyTorch Tutorial to Image
Captioning"), written from its description, so that ``benchmarks/speed.py`` can time it beside our
decoder in the same process, with the same sizes. What it keeps, because that is what costs time:

* training: captions sorted by length, the active batch cut to a prefix ``[:n]`` at every step;
  at every step the attention recomputes the annotation projection ``encoder_att(a)`` of the n
  active rows (P x C -> A per row), scores with ReLU additive attention, weights the annotations
  by elementwise product and sum, gates the context per channel with sigmoid(f_beta(h)), runs
  ``nn.LSTMCell`` on cat(embedding, gated context) and applies ``fc(dropout(h))`` inside the loop;
  h_0, c_0 are linear maps of the mean annotation (no tanh);
* beam search: one image at a time; its grid is expanded to k rows and the attention projection
  is recomputed for every live beam at every step; finished beams leave the beam (k shrinks)
  until k captions have ended or the step limit is reached;
* captioning a file (``caption_image_beam_search``): the image is read, resized to 256 x 256,
  scaled to [0, 1] and normalised, then run alone through the tutorial's encoder (ResNet-101
  without its pool and classifier, channels first, its grid pooled adaptively to 14 x 14: up from
  8 x 8 at 256 px) and searched alone.

``TutorialDecoder.from_ours`` copies the weights of one of our decoders (additive ReLU attention,
channel gate, plain linear output) so that both compute the same function: the test suite checks
that, which pins this baseline to the model it is compared with.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import torchvision
from PIL import Image
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence

from captioning.models.decoder import ShowAttendTellDecoder

# torchvision's ImageNet statistics, as the tutorial normalises
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class TutorialEncoder(nn.Module):
    """The tutorial's ``Encoder``: a ResNet without its average pool and classifier, the grid
    pooled adaptively to ``encoded_image_size`` squared, returned as (B, side, side, C).

    ``network`` names the torchvision ResNet (``resnet101`` in the tutorial); the weights are
    random (``weights=None``): the benchmark times it, no caption needs to mean anything.
    """

    def __init__(self, encoded_image_size: int = 14, network: str = "resnet101"):
        super().__init__()
        resnet = getattr(torchvision.models, network)(weights=None)
        self.resnet = nn.Sequential(*list(resnet.children())[:-2])
        self.adaptive_pool = nn.AdaptiveAvgPool2d((encoded_image_size, encoded_image_size))

    def forward(self, images: Tensor) -> Tensor:
        out = self.adaptive_pool(self.resnet(images))  # (B, C, side, side)
        return out.permute(0, 2, 3, 1)


@torch.no_grad()
def caption_image_beam_search(
    encoder: TutorialEncoder,
    decoder: TutorialDecoder,
    image_path: str | Path,
    beam_size: int,
    start_id: int,
    end_id: int,
    max_steps: int = 50,
    image_size: int = 256,
) -> tuple[list[int], Tensor]:
    """Caption ONE image file the tutorial's way: read it (PIL, RGB), resize it to ``image_size``
    squared, scale to [0, 1], normalise, encode it alone and search it alone (``tutorial_beam_search``).

    Returns:
        the word ids and the (words, side, side) attention maps.
    """
    device = next(decoder.parameters()).device
    with Image.open(image_path) as picture:
        pixels = np.asarray(
            picture.convert("RGB").resize((image_size, image_size), Image.Resampling.BILINEAR)
        )
    image = torch.from_numpy(pixels.transpose(2, 0, 1).copy()).float().div_(255.0)
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    image = ((image - mean) / std).to(device)
    grid = encoder(image.unsqueeze(0))  # (1, side, side, C)
    side = grid.size(1)
    tokens, maps = tutorial_beam_search(
        decoder, grid.reshape(-1, grid.size(3)), beam_size, start_id, end_id, max_steps
    )
    return tokens, maps.view(-1, side, side)


class TutorialAttention(nn.Module):
    """ReLU additive attention that projects the annotations again on every call."""

    def __init__(self, annotation_dim: int, hidden_dim: int, attention_dim: int):
        super().__init__()
        self.encoder_att = nn.Linear(annotation_dim, attention_dim)
        self.decoder_att = nn.Linear(hidden_dim, attention_dim)
        self.full_att = nn.Linear(attention_dim, 1)

    def forward(self, annotations: Tensor, hidden: Tensor) -> tuple[Tensor, Tensor]:
        """(n, P, C) annotations and (n, H) states -> context (n, C) and weights (n, P)."""
        projected = self.encoder_att(annotations)  # (n, P, A): the per-step redundancy
        query = self.decoder_att(hidden).unsqueeze(1)  # (n, 1, A)
        scores = self.full_att(torch.relu(projected + query)).squeeze(2)  # (n, P)
        alpha = torch.softmax(scores, dim=1)
        context = (annotations * alpha.unsqueeze(2)).sum(dim=1)  # (n, C)
        return context, alpha


class TutorialDecoder(nn.Module):
    """LSTMCell decoder with per-step attention over the annotation grid, the tutorial's way."""

    def __init__(
        self,
        vocab_size: int,
        annotation_dim: int,
        attention_dim: int = 512,
        embed_dim: int = 512,
        hidden_dim: int = 512,
        dropout: float = 0.5,
    ):
        super().__init__()
        self.vocab_size = vocab_size
        self.attention = TutorialAttention(annotation_dim, hidden_dim, attention_dim)
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.dropout = nn.Dropout(dropout)
        self.decode_step = nn.LSTMCell(embed_dim + annotation_dim, hidden_dim)
        self.init_h = nn.Linear(annotation_dim, hidden_dim)
        self.init_c = nn.Linear(annotation_dim, hidden_dim)
        self.f_beta = nn.Linear(hidden_dim, annotation_dim)
        self.fc = nn.Linear(hidden_dim, vocab_size)

    @classmethod
    def from_ours(cls, decoder: ShowAttendTellDecoder) -> TutorialDecoder:
        """A baseline holding the weights of ``decoder`` (additive attention, channel gate, linear output).

        Our fused LSTM weights map onto ``LSTMCell``'s (same gate order i, f, g, o): the input
        weights are the embedding and context shares, the recurrent weights the h share. Our
        biases that cancel or do not exist (score and query projections, the second LSTM bias)
        are zero here.
        """
        attention = decoder.attention
        context_dim = decoder.annotation_dim
        baseline = cls(
            decoder.vocab_size,
            context_dim,
            attention.annotation_proj.out_features,
            decoder.embedding.embedding_dim,
            decoder.hidden_dim,
            decoder.dropout.p,
        )
        recurrent = decoder.recurrent_to_gates.weight  # (4H, C + H)
        with torch.no_grad():
            baseline.attention.encoder_att.load_state_dict(attention.annotation_proj.state_dict())
            baseline.attention.decoder_att.weight.copy_(attention.query_proj.weight)
            baseline.attention.decoder_att.bias.zero_()
            baseline.attention.full_att.weight.copy_(attention.score.weight)
            baseline.attention.full_att.bias.zero_()
            baseline.embedding.load_state_dict(decoder.embedding.state_dict())
            baseline.decode_step.weight_ih.copy_(
                torch.cat([decoder.embed_to_gates.weight, recurrent[:, :context_dim]], dim=1)
            )
            baseline.decode_step.weight_hh.copy_(recurrent[:, context_dim:])
            baseline.decode_step.bias_ih.copy_(decoder.embed_to_gates.bias)
            baseline.decode_step.bias_hh.zero_()
            baseline.init_h.load_state_dict(decoder.init_h.state_dict())
            baseline.init_c.load_state_dict(decoder.init_c.state_dict())
            baseline.f_beta.load_state_dict(decoder.gate.state_dict())
            baseline.fc.load_state_dict(decoder.out.state_dict())
        return baseline.to(decoder.embedding.weight.device)

    def init_hidden_state(self, annotations: Tensor) -> tuple[Tensor, Tensor]:
        mean = annotations.mean(dim=1)  # (B, C)
        return self.init_h(mean), self.init_c(mean)

    def forward(self, annotations: Tensor, captions: Tensor, lengths: Tensor):
        """Teacher forcing, one image per caption.

        Args:
            annotations: (N, P, C); captions: (N, L) padded ids; lengths: (N,) tokens with <start>/<end>.
        Returns:
            logits (N, T, V) and alphas (N, T, P) in length-sorted order, the sorted captions,
            the decode lengths (a list) and the sort order.
        """
        lengths, order = lengths.sort(descending=True)
        annotations, captions = annotations[order], captions[order]
        embedded = self.embedding(captions)  # (N, L, m)
        h, c = self.init_hidden_state(annotations)
        decode_lengths = (lengths - 1).tolist()
        steps = max(decode_lengths)
        logits = annotations.new_zeros(len(decode_lengths), steps, self.vocab_size)
        alphas = annotations.new_zeros(len(decode_lengths), steps, annotations.size(1))
        for t in range(steps):
            n = sum(length > t for length in decode_lengths)
            context, alpha = self.attention(annotations[:n], h[:n])
            context = torch.sigmoid(self.f_beta(h[:n])) * context
            h, c = self.decode_step(torch.cat([embedded[:n, t], context], dim=1), (h[:n], c[:n]))
            logits[:n, t] = self.fc(self.dropout(h))
            alphas[:n, t] = alpha
        return logits, captions, decode_lengths, alphas, order


def tutorial_loss(
    logits: Tensor, captions: Tensor, decode_lengths: list[int], alphas: Tensor, penalty_weight: float = 1.0
) -> Tensor:
    """Cross-entropy over the packed real steps plus the doubly stochastic penalty (the tutorial's)."""
    scores = pack_padded_sequence(logits, decode_lengths, batch_first=True).data
    targets = pack_padded_sequence(captions[:, 1:], decode_lengths, batch_first=True).data
    return F.cross_entropy(scores, targets) + penalty_weight * ((1.0 - alphas.sum(dim=1)) ** 2).mean()


@torch.no_grad()
def tutorial_beam_search(
    decoder: TutorialDecoder,
    annotations: Tensor,
    beam_size: int,
    start_id: int,
    end_id: int,
    max_steps: int = 50,
) -> tuple[list[int], Tensor]:
    """The best caption of ONE image's grid (P, C) by the tutorial's search, and its attention maps.

    Beams that emit <end> leave the beam, which shrinks, until ``beam_size`` captions ended or
    ``max_steps`` steps passed; then the best finished caption by summed log-probability wins
    (the best live one when none finished, where the tutorial would fail).

    Returns:
        the word ids (without <start>/<end>) and (words, P) attention weights.
    """
    k = beam_size
    grid = annotations.unsqueeze(0).expand(k, *annotations.shape)  # (k, P, C)
    previous = torch.full((k,), start_id, dtype=torch.long, device=annotations.device)
    sequences = previous.unsqueeze(1)  # (k, 1)
    attention = annotations.new_zeros(k, 0, annotations.size(0))  # (k, t, P)
    top_scores = annotations.new_zeros(k, 1)
    h, c = decoder.init_hidden_state(grid)
    finished: list[tuple[float, list[int], Tensor]] = []
    for step in range(1, max_steps + 2):
        embedded = decoder.embedding(previous)  # (k, m)
        context, alpha = decoder.attention(grid, h)  # re-projects the grid for every beam
        context = torch.sigmoid(decoder.f_beta(h)) * context
        h, c = decoder.decode_step(torch.cat([embedded, context], dim=1), (h, c))
        scores = top_scores + torch.log_softmax(decoder.fc(h), dim=1)  # (k, V)
        if step == 1:  # all beams are the same start
            best, index = scores[0].topk(k)
        else:
            best, index = scores.view(-1).topk(k)
        source, word = index // decoder.vocab_size, index % decoder.vocab_size
        sequences = torch.cat([sequences[source], word.unsqueeze(1)], dim=1)
        attention = torch.cat([attention[source], alpha[source].unsqueeze(1)], dim=1)
        ended = word == end_id
        finished += [
            (float(best[i]), sequences[i, 1:-1].tolist(), attention[i, :-1])
            for i in ended.nonzero().flatten().tolist()
        ]
        live = (~ended).nonzero().flatten()
        k = live.numel()
        if k == 0 or step > max_steps:
            break
        sequences, attention, source = sequences[live], attention[live], source[live]
        grid, h, c = grid[source], h[source], c[source]
        top_scores, previous = best[live].unsqueeze(1), word[live]
    if not finished:
        finished = [
            (float(best[i]), sequences[i, 1:].tolist(), attention[i]) for i in range(sequences.size(0))
        ]
    _, tokens, maps = max(finished, key=lambda item: item[0])
    return tokens, maps
