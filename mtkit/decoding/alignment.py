"""Word alignments from cross-attention (`mtkit translate --alignments`).

Each output token is linked to the source token its decoder layer's cross-attention, averaged over
heads, weighs most (the source EOS left out), as fairseq and OpenNMT-py extract hard alignments. The other
direction is kept too (`source_links`): each source token is linked to the output token that weighs it most, in
that layer and the one below it averaged; inline tags are placed by it (`mtkit.documents.tags`), which put more of
them on the reference's words than the output-to-source links did (docs/documents.md).
Tokens are SentencePiece pieces; a word is a piece that starts with "▁" and the pieces after it, so
target word j is aligned to source word i when any piece of j links to a piece of i. Pairs print in
Pharaoh format, `i-j`, 0-based, sorted by target word then source word.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from mtkit.data.tokenizer import BOS_ID, PAD_ID
from mtkit.decoding.search import Hypothesis
from mtkit.models.base import EncoderDecoder

WORD_START = "\u2581"


@torch.inference_mode()
def link_hypotheses(model: EncoderDecoder, src: Tensor, *, src_mask: Tensor, found: list[list[Hypothesis]], layer: int) -> None:
    """Set `links` of every hypothesis from `layer`'s teacher-forced cross-attention, and `source_links` from it
    and the layer below it.

    src (B, S) ids with EOS and src_mask (B, S) of the searched batch; found[b] the hypotheses of source b.
    """
    rows = [b for b, hypotheses in enumerate(found) for _ in hypotheses]
    flat = [h for hypotheses in found for h in hypotheses]
    if not flat:
        return
    index = torch.tensor(rows, device=src.device)
    tgt = torch.full((len(flat), max(len(h.tokens) for h in flat) + 1), PAD_ID, dtype=torch.long)  # (N, T)
    for row, hypothesis in enumerate(flat):
        tgt[row, : len(hypothesis.tokens) + 1] = torch.tensor([BOS_ID, *hypothesis.tokens])
    memory, mask = model.encode(src, src_mask).index_select(0, index), src_mask.index_select(0, index)  # (N, S, D), (N, S)
    tgt = tgt.to(src.device)
    # Row t of the weights is the step that predicts token t (its input is token t - 1, or BOS).
    weights = model.cross_attention(tgt, memory, src_mask=mask, layer=layer).float().mean(dim=1)  # (N, T, S)
    below = max(layer % model.attention_layers - 1, 0)
    both = weights
    if below != layer % model.attention_layers:
        both = (weights + model.cross_attention(tgt, memory, src_mask=mask, layer=below).float().mean(dim=1)) / 2
    source_lengths = mask.sum(dim=1) - 1  # (N,) without EOS
    for row, hypothesis in enumerate(flat):
        length, count = int(source_lengths[row]), len(hypothesis.tokens)
        hypothesis.links = weights[row, :count, : max(length, 1)].argmax(dim=1).tolist()
        hypothesis.source_links = both[row, :count, :length].argmax(dim=0).tolist() if count and length else []


def word_alignment(source_pieces: Sequence[str], target_pieces: Sequence[str], *, links: Sequence[int]) -> list[tuple[int, int]]:
    """(source word, target word) pairs, 0-based and sorted, of target pieces linked to source pieces."""
    source_words, target_words = word_indices(source_pieces), word_indices(target_pieces)
    pairs = {(source_words[link], target_words[t]) for t, link in enumerate(links) if link < len(source_words)}
    return sorted(pairs, key=lambda pair: (pair[1], pair[0]))


def source_word_alignment(
    source_pieces: Sequence[str], target_pieces: Sequence[str], *, source_links: Sequence[int]
) -> list[tuple[int, int]]:
    """(source word, target word) pairs, 0-based and sorted, of source pieces linked to target pieces."""
    source_words, target_words = word_indices(source_pieces), word_indices(target_pieces)
    pairs = {
        (source_words[source], target_words[link])
        for source, link in enumerate(source_links)
        if source < len(source_words) and link < len(target_words)
    }
    return sorted(pairs, key=lambda pair: (pair[1], pair[0]))


def word_indices(pieces: Sequence[str]) -> list[int]:
    """The word number of each piece: a new word starts at every piece that begins with "▁"."""
    numbers, word = [], -1
    for position, piece in enumerate(pieces):
        if position == 0 or piece.startswith(WORD_START):
            word += 1
        numbers.append(word)
    return numbers


def pharaoh(pairs: Sequence[tuple[int, int]]) -> str:
    """`0-0 1-2 ...`: the pairs in Pharaoh format."""
    return " ".join(f"{source}-{target}" for source, target in pairs)
