"""The RNN encoder-decoders learn: each attention variant learns to reverse exactly, with greedy and beam
search, and a trained RNN saves and translates through the pipeline."""

from __future__ import annotations

import pytest
import torch
from helpers import MARGIN

from mtkit.decoding.search import SearchOptions, beam_search, greedy_search
from mtkit.decoding.translator import Translator
from mtkit.models.checkpoint import read_checkpoint, save_checkpoint
from mtkit.models.rnn import RNNSeq2Seq
from mtkit.training.loss import sequence_loss

VOCAB, BOS, EOS = 20, 2, 3


def _name(combination: dict) -> str:
    return "-".join(str(v) for v in combination.values())


def _reverse_batch(generator: torch.Generator, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random sources of 3-7 distinct symbols (ids 4..VOCAB-1) + EOS; targets are the symbols reversed (no symbol
    comes twice, as in `write_reverse_task`: repeats make the task ambiguous for a model this size)."""
    lengths = torch.randint(3, 8, (size,), generator=generator)
    src = torch.zeros(size, 8, dtype=torch.long)
    tgt_in = torch.zeros(size, 8, dtype=torch.long)
    tgt_out = torch.zeros(size, 8, dtype=torch.long)
    for row, length in enumerate(lengths.tolist()):
        symbols = torch.randperm(VOCAB - 4, generator=generator)[:length] + 4
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
        loss = sequence_loss(model(src, src_mask, tgt_in), tgt_out, label_smoothing=0.0) / tgt_out.ne(0).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    torch.set_num_threads(threads)
    model.eval()
    src, src_mask, tgt_in, tgt_out = _reverse_batch(torch.Generator().manual_seed(99), 100)
    with torch.no_grad():
        log_probs = torch.log_softmax(model(src, src_mask, tgt_in), dim=-1)  # (B, T, V)
    reference = log_probs.gather(2, tgt_out.unsqueeze(2)).squeeze(2)  # (B, T)
    others = log_probs.scatter(2, tgt_out.unsqueeze(2), float("-inf")).amax(dim=2)  # (B, T)
    margin = float((reference - others)[tgt_out.ne(0)].min())
    if margin < MARGIN:  # the outputs below would be at the mercy of the CPU's rounding
        pytest.fail(f"the {_name(variant)} model ended {margin:.2f} nats past the edge of learning, under {MARGIN}")
    expected = [row[row.ne(0)][:-1].tolist() for row in tgt_out]
    max_len = src_mask.sum(1) + 2
    assert [h.tokens for h in greedy_search(model, src, src_mask=src_mask, max_len=max_len, bos_id=BOS, eos_id=EOS)] == expected
    options = SearchOptions(beam=4, length_penalty=1.0, nbest=2)
    beams = beam_search(model, src, src_mask=src_mask, max_len=max_len, options=options, bos_id=BOS, eos_id=EOS)
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
