"""The RNN encoder-decoders honour the model contract: shapes, attention masking, padding,
incremental decoding, learning a reverse task, beam search, and the pipeline end to end."""

from __future__ import annotations

import itertools

import pytest
import torch

from mtkit.config import ModelConfig
from mtkit.decoding.search import SearchOptions, beam_search, greedy_search
from mtkit.decoding.translator import Translator
from mtkit.errors import MtkitError
from mtkit.models import build_model
from mtkit.models.base import padding_mask
from mtkit.models.checkpoint import read_checkpoint, save_checkpoint
from mtkit.models.rnn import RNNSeq2Seq
from mtkit.training.loss import sequence_loss

VOCAB, BOS, EOS = 20, 2, 3
ATTENTION = ["none", "bahdanau", "luong_dot", "luong_general"]
COMBINATIONS = [
    {"cell": cell, "attention": attention, "input_feed": feed}
    for cell, attention, feed in itertools.product(["lstm", "gru"], ATTENTION, [False, True])
    if not feed or attention.startswith("luong")
]


def small_rnn(**overrides) -> RNNSeq2Seq:
    torch.manual_seed(0)
    arguments = dict(layers=2, hidden_size=16, embed_dim=8, dropout=0.0)
    arguments.update(overrides)
    return RNNSeq2Seq(VOCAB, VOCAB, **arguments).eval()


def padded_batch():
    """Three sources of lengths 7, 5 and 3 (padding 0) and three 6-token targets."""
    generator = torch.Generator().manual_seed(1)
    src = torch.randint(4, VOCAB, (3, 7), generator=generator)
    src[1, 5:] = 0
    src[2, 3:] = 0
    tgt = torch.randint(4, VOCAB, (3, 6), generator=generator)
    return src, padding_mask(src, 0), tgt


def _name(combination: dict) -> str:
    return "-".join(str(v) for v in combination.values())


@pytest.mark.parametrize("combination", COMBINATIONS, ids=_name)
def test_shapes(combination):
    model = small_rnn(**combination)
    src, src_mask, tgt = padded_batch()
    memory = model.encode(src, src_mask)
    logits, state = model.decode(tgt, memory, src_mask, None)
    assert memory.shape == (3, 7, 16)
    assert logits.shape == (3, 6, VOCAB)
    assert state is None
    _, state = model.decode(tgt[:, :1], memory, src_mask, {})
    assert state["hidden"].shape == (3, 2, 16)
    assert ("cell" in state) == (combination["cell"] == "lstm")
    assert ("feed" in state) == combination["input_feed"]
    assert ("cross_keys" in state) == (combination["attention"] != "none")


@pytest.mark.parametrize("combination", [c for c in COMBINATIONS if c["attention"] != "none"], ids=_name)
def test_attention_is_zero_on_source_padding_and_each_row_sums_to_one(combination):
    model = small_rnn(**combination)
    src, src_mask, tgt = padded_batch()
    weights = model.cross_attention(tgt, model.encode(src, src_mask), src_mask)  # (B, 1, T, S)
    assert weights.shape == (3, 1, 6, 7)
    assert torch.all(weights[1, :, :, 5:] == 0) and torch.all(weights[2, :, :, 3:] == 0)
    assert torch.all(weights[:, :, :, :3] > 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 1, 6))


def test_a_model_without_attention_has_no_heatmap():
    model = small_rnn(attention="none")
    src, src_mask, tgt = padded_batch()
    with pytest.raises(MtkitError, match="no attention"):
        model.cross_attention(tgt, model.encode(src, src_mask), src_mask)


@pytest.mark.parametrize("combination", COMBINATIONS, ids=_name)
def test_source_padding_does_not_change_outputs(combination):
    model = small_rnn(**combination)
    src, src_mask, tgt = padded_batch()
    plain = model(src[1:2, :5], src_mask[1:2, :5], tgt[1:2])
    padded = model(src[1:2], src_mask[1:2], tgt[1:2])  # the same sentence with two pads
    in_batch = model(src, src_mask, tgt)[1:2]
    torch.testing.assert_close(padded, plain, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(in_batch, plain, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("combination", COMBINATIONS, ids=_name)
def test_incremental_decoding_equals_teacher_forcing(combination):
    model = small_rnn(**combination)
    src, src_mask, tgt = padded_batch()
    memory = model.encode(src, src_mask)
    full, _ = model.decode(tgt, memory, src_mask, None)
    state: dict = {}
    steps = []
    for position in range(tgt.size(1)):
        logits, state = model.decode(tgt[:, position : position + 1], memory, src_mask, state)
        steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-6)
    # Reordering the state reorders the next step's output.
    order = torch.tensor([2, 0, 1])
    reordered = model.reorder_state(dict(state), order)
    after, _ = model.decode(tgt[order, -1:], memory[order], src_mask[order], reordered)
    expected, _ = model.decode(tgt[:, -1:], memory, src_mask, state)
    torch.testing.assert_close(after, expected[order])


def test_tied_embeddings_share_one_matrix_and_settings_are_checked():
    model = small_rnn(tie_embeddings=True)
    assert model.output.weight is model.decoder.embed.weight is model.encoder.embed.weight
    untied = small_rnn(tie_embeddings=False)
    assert untied.output.weight is not untied.decoder.embed.weight
    with pytest.raises(MtkitError, match="input_feed"):
        small_rnn(attention="bahdanau", input_feed=True)
    with pytest.raises(MtkitError, match="even"):
        small_rnn(hidden_size=15, bidirectional=True)
    config = ModelConfig(arch="rnn", cell="gru", layers=1, hidden_size=16, embed_dim=8, attention="luong_general")
    built = build_model(config, VOCAB, VOCAB, share_vocab=True)
    assert isinstance(built, RNNSeq2Seq) and isinstance(built.decoder.rnn, torch.nn.GRU)


def _reverse_batch(generator: torch.Generator, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random sources of 3-7 symbols (ids 4..VOCAB-1) + EOS; targets are the symbols reversed."""
    lengths = torch.randint(3, 8, (size,), generator=generator)
    src = torch.zeros(size, 8, dtype=torch.long)
    tgt_in = torch.zeros(size, 8, dtype=torch.long)
    tgt_out = torch.zeros(size, 8, dtype=torch.long)
    for row, length in enumerate(lengths.tolist()):
        symbols = torch.randint(4, VOCAB, (length,), generator=generator)
        src[row, : length + 1] = torch.cat([symbols, torch.tensor([EOS])])
        tgt_in[row, : length + 1] = torch.cat([torch.tensor([BOS]), symbols.flip(0)])
        tgt_out[row, : length + 1] = torch.cat([symbols.flip(0), torch.tensor([EOS])])
    return src, src.ne(0), tgt_in, tgt_out


@pytest.mark.parametrize(
    "variant",
    [
        {"cell": "gru", "attention": "bahdanau"},
        {"cell": "lstm", "attention": "luong_dot"},
        {"cell": "lstm", "attention": "luong_general", "input_feed": True},
    ],
    ids=_name,
)
@pytest.mark.slow
def test_each_attention_variant_learns_to_reverse_exactly(variant):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: more threads only add overhead
    torch.manual_seed(0)
    model = RNNSeq2Seq(VOCAB, VOCAB, layers=1, hidden_size=64, embed_dim=32, dropout=0.0, **variant)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    steps = 300
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda done: 1 - done / steps)  # annealing makes it exact
    generator = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        src, src_mask, tgt_in, tgt_out = _reverse_batch(generator, 64)
        loss = sequence_loss(model(src, src_mask, tgt_in), tgt_out, 0.0) / tgt_out.ne(0).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    torch.set_num_threads(threads)
    model.eval()
    src, src_mask, _, tgt_out = _reverse_batch(torch.Generator().manual_seed(99), 100)
    expected = [row[row.ne(0)][:-1].tolist() for row in tgt_out]
    max_len = src_mask.sum(1) + 2
    assert [h.tokens for h in greedy_search(model, src, src_mask, max_len, bos_id=BOS, eos_id=EOS)] == expected
    options = SearchOptions(beam=4, length_penalty=1.0, nbest=2)
    beams = beam_search(model, src, src_mask, max_len, options, bos_id=BOS, eos_id=EOS)
    assert [hypotheses[0].tokens for hypotheses in beams] == expected
    assert all(len(hypotheses) == 2 and hypotheses[0].score >= hypotheses[1].score for hypotheses in beams)


def test_rnn_trains_saves_and_translates_through_the_pipeline(reverse_rnn_run, tmp_path):
    config = reverse_rnn_run
    sources = (config.data_path.parent / "raw/valid.src").read_text().splitlines()
    targets = (config.data_path.parent / "raw/valid.tgt").read_text().splitlines()
    translator = Translator.load(config.run_path)
    assert isinstance(translator.engine.model, RNNSeq2Seq)
    hypotheses = translator.translate(sources, beam=4)
    assert sum(h == t for h, t in zip(hypotheses, targets, strict=True)) >= 0.9 * len(targets)
    # Checkpoint round trip: a copy of best.pt gives identical logits.
    copy = tmp_path / "copy.pt"
    save_checkpoint(read_checkpoint(config.run_path / "best.pt"), copy)
    reloaded = Translator.load(copy).engine.model
    src = torch.tensor([[5, 6, 7, 3]])
    with torch.inference_mode():
        torch.testing.assert_close(reloaded(src, src.ne(0), src), translator.engine.model(src, src.ne(0), src), rtol=0, atol=0)
