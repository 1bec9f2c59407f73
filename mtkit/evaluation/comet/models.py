"""The three COMET model classes mtkit scores with, each computing what unbabel-comet's class of the same name does.

- `RegressionMetric` (wmt22-comet-da): source, translation and reference encoded apart, each pooled to a sentence
  embedding; the estimator reads [mt, ref, mt*ref, |mt-ref|, mt*src, |mt-src|].
- `ReferencelessRegression` (wmt20/21 COMET-QE): the same without the reference, [mt, src, mt*src, |mt-src|].
- `UnifiedMetric` (wmt22-cometkiwi-da): translation and source (and reference, where its input_segments have it)
  joined in one input, <s> mt </s></s> src </s>; the estimator reads the mixed layers' first position.

A model takes its encoder (transformers' XLMRobertaModel, built by `scorer.py`) and reads token ids; batches are
lists of id lists, each with its <s> and </s>, padded here.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mtkit.evaluation.comet.layers import FeedForward, LayerwiseAttention, pool

Ids = list[list[int]]  # one list of token ids per sentence, <s> ... </s>


class CometModel(nn.Module):
    """What every class shares: the encoder, and the token states it scores from (a mix of its layers or one).

    Args:
        encoder: an XLM-R encoder called as encoder(input_ids=, attention_mask=, output_hidden_states=True).
        num_layers: its hidden states, embeddings included (transformer layers + 1).
        layer: "mix" (a learned mix of all) or the index of one.
        pad_id: the tokenizer's padding id.
    """

    def __init__(self, encoder: nn.Module, *, num_layers: int, layer: str | int, layer_norm: bool, transformation: str,
                 pad_id: int) -> None:  # fmt: skip
        super().__init__()
        self.encoder = encoder
        self.layer = layer
        self.pad_id = pad_id
        mix = layer == "mix"
        self.layerwise_attention = (
            LayerwiseAttention(num_layers, layer_norm=layer_norm, transformation=transformation) if mix else None
        )

    def token_states(self, input_ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """(B, T) ids and mask -> the (B, T, H) states scored from, and the last layer's (B, T, H)."""
        layers = self.encoder(input_ids=input_ids, attention_mask=mask, output_hidden_states=True).hidden_states
        if self.layerwise_attention is not None:
            return self.layerwise_attention(layers, mask), layers[-1]
        return layers[int(self.layer)], layers[-1]

    def padded(self, ids: Ids) -> tuple[Tensor, Tensor]:
        """Id lists -> (B, T) ids padded with pad_id, and the (B, T) mask of real tokens, on the model's device."""
        device = next(self.parameters()).device
        longest = max(len(sentence) for sentence in ids)
        input_ids = torch.full((len(ids), longest), self.pad_id, dtype=torch.long)
        for row, sentence in enumerate(ids):
            input_ids[row, : len(sentence)] = torch.tensor(sentence, dtype=torch.long)
        return input_ids.to(device), input_ids.ne(self.pad_id).long().to(device)


class RegressionMetric(CometModel):
    """Reference-based COMET: each side encoded apart and pooled; `features` sentence embeddings into the estimator."""

    features = 6

    def __init__(self, encoder: nn.Module, *, num_layers: int, hidden_size: int, layer: str | int, layer_norm: bool,
                 transformation: str, pad_id: int, pooling: str, hidden_sizes: list[int], activation: str,
                 final_activation: str | None) -> None:  # fmt: skip
        super().__init__(encoder, num_layers=num_layers, layer=layer, layer_norm=layer_norm, transformation=transformation,
                         pad_id=pad_id)  # fmt: skip
        self.pooling = pooling
        self.estimator = FeedForward(
            hidden_size * self.features, hidden_sizes, activation=activation, final_activation=final_activation
        )

    def sentence_embedding(self, ids: Ids) -> Tensor:
        """Id lists -> (B, H) sentence embeddings, pooled as the checkpoint was trained ("default": <s> of the last layer)."""
        input_ids, mask = self.padded(ids)
        states, last = self.token_states(input_ids, mask)
        if self.pooling == "default":
            return last[:, 0, :]
        return pool(states, input_ids, mask=mask, how=self.pooling, pad_id=self.pad_id)

    def forward(self, src: Ids, mt: Ids, ref: Ids | None) -> Tensor:
        """One score per sentence, (B,)."""
        assert ref is not None, "the scorer checks that a reference-based model is given references"
        src_emb, ref_emb, mt_emb = self.sentence_embedding(src), self.sentence_embedding(ref), self.sentence_embedding(mt)
        features = (mt_emb, ref_emb, mt_emb * ref_emb, torch.abs(mt_emb - ref_emb), mt_emb * src_emb, torch.abs(mt_emb - src_emb))
        return self.estimator(torch.cat(features, dim=1))


class ReferencelessRegression(RegressionMetric):
    """COMET-QE of the regression kind: the translation against its source only."""

    features = 4

    def forward(self, src: Ids, mt: Ids, ref: Ids | None) -> Tensor:
        """One score per sentence, (B,); a reference is not read."""
        src_emb, mt_emb = self.sentence_embedding(src), self.sentence_embedding(mt)
        return self.estimator(torch.cat((mt_emb, src_emb, mt_emb * src_emb, torch.abs(mt_emb - src_emb)), dim=1))


class UnifiedMetric(CometModel):
    """COMETKiwi's class: the segments joined into one input, scored from its first position of the layer mix.

    With source and reference both in `segments` and given, the score is the mean of three inputs,
    [mt, src], [mt, ref] and [mt, src, ref], as unbabel-comet averages them.
    """

    def __init__(self, encoder: nn.Module, *, num_layers: int, hidden_size: int, layer: str | int, layer_norm: bool,
                 transformation: str, pad_id: int, special_ids: tuple[int, int], max_positions: int, segments: list[str],
                 hidden_sizes: list[int], activation: str, final_activation: str | None) -> None:  # fmt: skip
        super().__init__(encoder, num_layers=num_layers, layer=layer, layer_norm=layer_norm, transformation=transformation,
                         pad_id=pad_id)  # fmt: skip
        self.cls_id, self.sep_id = special_ids
        self.max_positions = max_positions
        self.segments = segments
        self.estimator = FeedForward(hidden_size, hidden_sizes, activation=activation, final_activation=final_activation)

    def forward(self, src: Ids, mt: Ids, ref: Ids | None) -> Tensor:
        """One score per sentence, (B,)."""
        given = [side for name, side in (("src", src), ("ref", ref)) if name in self.segments and side is not None]
        if len(given) == 2:
            inputs = [[mt, given[0]], [mt, given[1]], [mt, *given]]
            return torch.stack([self.joint_score(parts) for parts in inputs]).mean(dim=0)
        return self.joint_score([mt, *given])

    def joint_score(self, parts: list[Ids]) -> Tensor:
        """The segments of each sentence joined, encoded together, scored from position 0: (B,)."""
        input_ids, mask = self.padded([self.joined([part[row] for part in parts]) for row in range(len(parts[0]))])
        states, _ = self.token_states(input_ids, mask)
        return self.estimator(states[:, 0, :])

    def joined(self, segments: list[list[int]]) -> list[int]:
        """<s> a </s></s> b </s> (...), cut at max_positions when the pieces do not fit, as unbabel-comet cuts."""
        sequence = segments[0]
        for segment in segments[1:]:
            sequence = [self.cls_id, *sequence[1:-1], self.sep_id, self.sep_id, *segment[1:-1], self.sep_id]
        content = sum(len(segment) - 2 for segment in segments)
        if content > self.max_positions - (1 + 2 * len(segments)):
            sequence = sequence[: self.max_positions]
        return sequence
