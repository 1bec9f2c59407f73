"""RNN encoder-decoders behind the shared model contract: multi-layer LSTM or GRU, an optional
bidirectional encoder, and attention: none (Sutskever et al., 2014), additive (Bahdanau et al.,
2015), or dot/general (Luong et al., 2015) with optional input feeding.

The encoder packs padded sources, so padding never changes results. A bidirectional encoder gives
each direction half of `hidden_size` (as OpenNMT-py does), so the memory is (B, S, H) for every
variant. A bridge (Linear + tanh) maps the encoder's final state to each decoder layer's initial
state. The incremental state holds batch-first tensors, so the base `reorder_state` applies as is:
`hidden` (B, L, H), `cell` (B, L, H) for LSTMs, `feed` (B, E) for input feeding and the attention
keys `keys` (B, S, H), projected once per sentence.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from mtkit.errors import MtkitError
from mtkit.models.base import DecoderState, EncoderDecoder, OutputRows, project
from mtkit.models.layers import Dropout

RNN_CELLS = {"lstm": nn.LSTM, "gru": nn.GRU}
ATTENTION_KINDS = ("none", "bahdanau", "luong_dot", "luong_general")


class Attention(nn.Module):
    """Attention of decoder states over the memory with an additive, dot or general score.

    additive (Bahdanau): v^T tanh(W_q q + W_k m); dot (Luong): q^T m; general (Luong): q^T W_a m.
    """

    def __init__(self, kind: str, hidden_size: int) -> None:
        super().__init__()
        self.kind = kind
        if kind in ("bahdanau", "luong_general"):
            self.key_projection = nn.Linear(hidden_size, hidden_size, bias=False)
        if kind == "bahdanau":
            self.query_projection = nn.Linear(hidden_size, hidden_size)
            self.energy = nn.Linear(hidden_size, 1, bias=False)

    def keys(self, memory: Tensor) -> Tensor:
        """(B, S, H) keys of the memory; computed once per sentence and cached in the state."""
        return memory if self.kind == "luong_dot" else self.key_projection(memory)

    def forward(self, query: Tensor, keys: Tensor, memory: Tensor, src_mask: Tensor) -> tuple[Tensor, Tensor]:
        """query (B, T, H) -> context (B, T, H) and weights (B, T, S), zero on source padding."""
        if self.kind == "bahdanau":
            hidden = torch.tanh(self.query_projection(query).unsqueeze(2) + keys.unsqueeze(1))  # (B, T, S, H)
            scores = self.energy(hidden).squeeze(-1)  # (B, T, S)
        else:
            scores = query @ keys.transpose(1, 2)  # (B, T, S)
        scores = scores.masked_fill(~src_mask.unsqueeze(1), float("-inf"))
        weights = torch.softmax(scores.float(), dim=-1).to(memory.dtype)  # (B, T, S)
        return weights @ memory, weights


class RNNEncoder(nn.Module):
    """Embeddings and a (bidirectional) multi-layer RNN over packed sources."""

    def __init__(
        self, embed: nn.Embedding, cell: str, *, hidden_size: int, layers: int, bidirectional: bool, dropout: float
    ) -> None:
        super().__init__()
        self.embed = embed
        self.bidirectional = bidirectional
        directions = 2 if bidirectional else 1
        self.rnn = RNN_CELLS[cell](
            embed.embedding_dim,
            hidden_size // directions,
            num_layers=layers,
            batch_first=True,
            bidirectional=bidirectional,
            dropout=dropout if layers > 1 else 0.0,
        )
        self.dropout = Dropout(dropout)

    def forward(self, src: Tensor, src_mask: Tensor) -> Tensor:
        """src (B, S) ids, src_mask (B, S) -> memory (B, S, H), zeros on padding."""
        lengths = src_mask.sum(dim=1).clamp(min=1).cpu()
        packed = pack_padded_sequence(self.dropout(self.embed(src)), lengths, batch_first=True, enforce_sorted=False)
        output, _ = self.rnn(packed)
        memory, _ = pad_packed_sequence(output, batch_first=True, total_length=src.size(1))
        return memory  # (B, S, H)

    def final_state(self, memory: Tensor, src_mask: Tensor) -> Tensor:
        """(B, H) top-layer final state: forward direction at the last real token, backward at the first."""
        rows = torch.arange(memory.size(0), device=memory.device)
        last = memory[rows, src_mask.sum(dim=1).clamp(min=1) - 1]  # (B, H)
        if not self.bidirectional:
            return last
        half = memory.size(2) // 2
        return torch.cat([last[:, :half], memory[:, 0, half:]], dim=-1)


class RNNDecoder(nn.Module):
    """A multi-layer RNN decoder, one variant per attention kind.

    - none: readout from the RNN output; the encoder is seen only through the bridged initial state.
    - bahdanau: the previous top state queries the memory; the context is an RNN input; the readout
      sees the output, the context and the input embedding.
    - luong_*: the new RNN output queries the memory; the readout is tanh(W_c [context; output]),
      fed to the next step's input with input feeding.
    """

    def __init__(
        self,
        embed: nn.Embedding,
        cell: str,
        *,
        hidden_size: int,
        layers: int,
        attention: str,
        input_feed: bool,
        dropout: float,
    ) -> None:
        super().__init__()
        embed_dim = embed.embedding_dim
        self.embed = embed
        self.cell = cell
        self.layers = layers
        self.attention_kind = attention
        self.input_feed = input_feed
        self.attention = Attention(attention, hidden_size) if attention != "none" else None
        rnn_input = embed_dim + (hidden_size if attention == "bahdanau" else 0) + (embed_dim if input_feed else 0)
        between_layers = dropout if layers > 1 else 0.0
        self.rnn = RNN_CELLS[cell](rnn_input, hidden_size, num_layers=layers, batch_first=True, dropout=between_layers)
        self.bridge = nn.Linear(hidden_size, hidden_size)
        readout_input = hidden_size + {"none": 0, "bahdanau": hidden_size + embed_dim}.get(attention, hidden_size)
        self.readout = nn.Linear(readout_input, embed_dim)
        self.dropout = Dropout(dropout)

    @property
    def stepwise(self) -> bool:
        """Whether each step needs the previous step's output (so teacher forcing loops over time)."""
        return self.attention_kind == "bahdanau" or self.input_feed

    def start(self, final: Tensor, memory: Tensor, *, state: DecoderState) -> None:
        """Fill an empty state: bridged initial hidden state per layer, zero cell and feed, keys."""
        batch = final.size(0)
        hidden = torch.tanh(self.bridge(final))  # (B, H)
        state["hidden"] = hidden.unsqueeze(1).expand(batch, self.layers, hidden.size(1)).contiguous()  # (B, L, H)
        if self.cell == "lstm":
            state["cell"] = torch.zeros_like(state["hidden"])
        if self.input_feed:
            state["feed"] = hidden.new_zeros(batch, self.embed.embedding_dim)  # (B, E)
        if self.attention is not None:
            state["cross_keys"] = self.attention.keys(memory)  # (B, S, H)

    def forward(self, tgt: Tensor, memory: Tensor, src_mask: Tensor, state: DecoderState) -> tuple[Tensor, Tensor | None]:
        """tgt (B, T) -> readout (B, T, E) and attention weights (B, T, S) (None without attention)."""
        embedded = self.dropout(self.embed(tgt))  # (B, T, E)
        if not self.stepwise:
            return self._steps(embedded, memory, src_mask, state)
        steps = [self._steps(embedded[:, t : t + 1], memory, src_mask, state) for t in range(tgt.size(1))]
        weights = [w for _, w in steps]
        readout = torch.cat([r for r, _ in steps], dim=1)
        return readout, (torch.cat(weights, dim=1) if self.attention is not None else None)  # type: ignore[arg-type]

    def _steps(self, embedded: Tensor, memory: Tensor, src_mask: Tensor, state: DecoderState) -> tuple[Tensor, Tensor | None]:
        """Advance over embedded (B, T, E); T is 1 whenever `stepwise`. Updates `state` in place."""
        hidden = state["hidden"].transpose(0, 1).contiguous()  # (L, B, H)
        inputs, context, weights = [embedded], None, None
        if self.attention_kind == "bahdanau":  # 1. the previous top state attends
            context, weights = self.attention(hidden[-1].unsqueeze(1), state["cross_keys"], memory, src_mask)  # (B, 1, H)
            inputs.append(context)
        if self.input_feed:
            inputs.append(state["feed"].unsqueeze(1))  # (B, 1, E)
        # 2. the RNN advances
        recurrent = (hidden, state["cell"].transpose(0, 1).contiguous()) if self.cell == "lstm" else hidden
        output, recurrent = self.rnn(torch.cat(inputs, dim=-1), recurrent)  # output (B, T, H)
        hidden, cell = recurrent if self.cell == "lstm" else (recurrent, None)
        state["hidden"] = hidden.transpose(0, 1)  # (B, L, H)
        if cell is not None:
            state["cell"] = cell.transpose(0, 1)
        # 3. the readout
        if self.attention_kind == "bahdanau":
            features = [output, context, embedded]
        elif self.attention is not None:  # Luong: the new output attends
            context, weights = self.attention(output, state["cross_keys"], memory, src_mask)
            features = [context, output]
        else:
            features = [output]
        readout = torch.tanh(self.readout(torch.cat(features, dim=-1)))  # (B, T, E)
        if self.input_feed:
            state["feed"] = readout[:, -1]
        return readout, weights


class RNNSeq2Seq(EncoderDecoder):
    """RNN encoder-decoder. Plain arguments so tests can build one without a config."""

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        *,
        cell: str = "lstm",
        layers: int = 2,
        hidden_size: int = 512,
        embed_dim: int = 256,
        bidirectional: bool = True,
        attention: str = "bahdanau",
        input_feed: bool = False,
        dropout: float = 0.3,
        tie_embeddings: bool = True,
        share_vocab: bool = True,
        pad_id: int = 0,
    ) -> None:
        super().__init__()
        _check(cell, hidden_size, bidirectional, attention, input_feed)
        src_embed = _embedding(src_vocab_size, embed_dim, pad_id)
        share = tie_embeddings and share_vocab and src_vocab_size == tgt_vocab_size
        tgt_embed = src_embed if share else _embedding(tgt_vocab_size, embed_dim, pad_id)
        self.encoder = RNNEncoder(
            src_embed, cell, hidden_size=hidden_size, layers=layers, bidirectional=bidirectional, dropout=dropout
        )
        self.decoder = RNNDecoder(
            tgt_embed, cell, hidden_size=hidden_size, layers=layers, attention=attention, input_feed=input_feed, dropout=dropout
        )
        self.output = nn.Linear(embed_dim, tgt_vocab_size, bias=False)
        if tie_embeddings:
            self.output.weight = tgt_embed.weight

    @property
    def attention_layers(self) -> int:
        return 0 if self.decoder.attention is None else 1

    def vocabulary_rows(self) -> dict[str, str]:
        return {"encoder.embed.weight": "src", "decoder.embed.weight": "tgt", "output.weight": "tgt"}

    def part_of(self, name: str) -> str:
        """Embeddings (and the tied output weight), encoder, decoder or output (its own weight)."""
        part, child = name.split(".")[:2]
        return "embeddings" if child == "embed" else part if part in ("encoder", "decoder") else "output"

    def encode(self, src: Tensor, src_mask: Tensor, *, src_padded: bool | None = None) -> Tensor:
        """src (B, S) ids, src_mask (B, S) bool -> memory (B, S, H). The RNN always uses the mask (`src_padded` unused)."""
        return self.encoder(src, src_mask)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        *,
        src_mask: Tensor,
        state: DecoderState | None = None,
        src_padded: bool | None = None,
        output_rows: OutputRows | None = None,
    ) -> tuple[Tensor, DecoderState | None]:
        """tgt (B, T) new decoder inputs -> logits (B, T, V), or (B, T, V') of `output_rows`; see `mtkit.models.base`."""
        readout, _ = self._run_decoder(tgt, memory, src_mask, state)
        return project(self.output, self.decoder.dropout(readout), output_rows=output_rows), state

    def final_states(self, tgt: Tensor, memory: Tensor, *, src_mask: Tensor, src_padded: bool | None = None) -> Tensor:
        """Teacher-forced tgt (B, T) -> the readout after dropout (B, T, E) that `output` projects."""
        readout, _ = self._run_decoder(tgt, memory, src_mask, None)
        return self.decoder.dropout(readout)

    def cross_attention(self, tgt: Tensor, memory: Tensor, *, src_mask: Tensor, layer: int = -1) -> Tensor:
        """(B, 1, T, S) attention weights of teacher-forced decoding (one head; `layer` 0 or -1, the only one)."""
        _, weights = self._run_decoder(tgt, memory, src_mask, None)
        if weights is None:
            raise MtkitError("this model has no attention (model.attention: none); there is nothing to plot")
        return weights.unsqueeze(1)

    def _run_decoder(
        self, tgt: Tensor, memory: Tensor, src_mask: Tensor, state: DecoderState | None
    ) -> tuple[Tensor, Tensor | None]:
        cache: DecoderState = state if state is not None else {}
        if "hidden" not in cache:
            self.decoder.start(self.encoder.final_state(memory, src_mask), memory, state=cache)
        return self.decoder(tgt, memory, src_mask, cache)


def _embedding(vocab_size: int, embed_dim: int, pad_id: int) -> nn.Embedding:
    embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=pad_id)
    nn.init.normal_(embedding.weight, mean=0.0, std=embed_dim**-0.5)
    with torch.no_grad():
        embedding.weight[pad_id].zero_()
    return embedding


def _check(cell: str, hidden_size: int, bidirectional: bool, attention: str, input_feed: bool) -> None:
    if cell not in RNN_CELLS:
        raise MtkitError(f"model.cell={cell!r}: choose lstm or gru")
    if attention not in ATTENTION_KINDS:
        raise MtkitError(f"model.attention={attention!r}: choose one of {', '.join(ATTENTION_KINDS)}")
    if bidirectional and hidden_size % 2:
        raise MtkitError(f"model.hidden_size={hidden_size} must be even with a bidirectional encoder (half per direction)")
    if input_feed and not attention.startswith("luong"):
        raise MtkitError(
            f"model.input_feed applies to Luong attention only (model.attention is {attention}); "
            "use luong_dot or luong_general, or set model.input_feed: false"
        )
