"""Search over a batch's vocabulary shortlist: the same outputs as the full vocabulary when the shortlist holds what
the search needs, a different one when it lacks a needed piece; prefixes, constraints and specials always kept."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import SMALL_VOCAB, small_transformer

from mtkit.data.shortlist import Shortlist
from mtkit.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from mtkit.decoding.engine import PyTorchEngine, SourceBatch, shortlist_choice
from mtkit.decoding.options import Sampling
from mtkit.decoding.search import SearchOptions
from mtkit.decoding.shortlist import BatchVocabulary
from mtkit.decoding.terminology.constrained import TermRequest
from mtkit.errors import OptionError
from mtkit.models.base import OutputRows
from mtkit.models.ensemble import Ensemble
from mtkit.models.packed import pack_linears
from mtkit.models.rnn import RNNSeq2Seq

SPECIALS = [PAD_ID, UNK_ID, BOS_ID, EOS_ID]
LIKELY = list(range(4, 14))  # the pieces the model gives almost all its mass to (the rest: a bias of -1e4)
SOURCES = [[5, 6, 7, 8, 9], [10, 11, 12], [4, 13, 6]]
CAPS = [7, 5, 5]


def peaked(model: torch.nn.Module) -> torch.nn.Module:
    """The model with every piece outside LIKELY (and EOS) made about impossible by the output bias: a shortlist holding
    LIKELY then changes no log-probability the search compares (exp(-1e4) is 0 in float32)."""
    with torch.no_grad():
        model.output.bias.fill_(-1e4)
        model.output.bias[[EOS_ID, *LIKELY]] = 0.0
    return model


def transformer() -> torch.nn.Module:
    return peaked(small_transformer(output_bias=True, tie_embeddings=False))


def holding(pieces: list[int]) -> Shortlist:
    """A shortlist that keeps `pieces` (and the specials) for every source."""
    kept = np.array(sorted({*SPECIALS, *pieces}))
    return Shortlist(candidates=np.full((SMALL_VOCAB, 1), -1), frequent=kept, target_vocab=SMALL_VOCAB, info={})


def searched(engine: PyTorchEngine, options: SearchOptions, **batch: object) -> list[list[tuple[list[int], float]]]:
    found = engine.search(SourceBatch(indices=[0, 1, 2], sources=SOURCES, max_len=CAPS, **batch), options)
    return [[(h.tokens, round(h.score, 4)) for h in hypotheses] for hypotheses in found]


def compared(model: torch.nn.Module, shortlist: Shortlist, options: SearchOptions, **batch: object) -> tuple[list, list]:
    """The search's outputs over the full vocabulary and over the shortlist."""
    full = searched(PyTorchEngine(model), options, **batch)
    cut = PyTorchEngine(model, shortlist=shortlist)
    with_shortlist = searched(cut, SearchOptions(**{**options.__dict__, "shortlist": True}), **batch)
    return full, with_shortlist


@pytest.mark.parametrize(("beam", "nbest"), [(1, 1), (3, 1), (4, 3)])
def test_a_shortlist_holding_the_likely_pieces_gives_the_full_vocabularys_outputs(beam, nbest):
    full, cut = compared(transformer(), holding(LIKELY), SearchOptions(beam=beam, nbest=nbest))
    assert cut == full
    assert any(len(hypotheses[0][0]) > 2 for hypotheses in full)  # the search had pieces to choose among


def test_prefixes_and_constraints_give_the_same_outputs_and_their_pieces_are_kept():
    prefixes = [[20, 21], [], [22]]  # outside the shortlist: kept for the batch all the same
    terms = TermRequest(constraints=[[[[7, 8]]], [], [[[9], [30]]]], continues_word=(False,) * SMALL_VOCAB)
    full, cut = compared(transformer(), holding(LIKELY), SearchOptions(beam=3, nbest=2), prefixes=prefixes, terms=terms)
    assert cut == full
    assert [hypotheses[0][0][:2] for hypotheses in cut] == [[20, 21], [*cut[1][0][0][:2]], [22, *cut[2][0][0][1:2]]]


def test_a_constraints_pieces_are_kept_even_when_the_shortlist_lacks_them():
    model = small_transformer()  # no peaked bias: every piece is likely enough to rank
    terms = TermRequest(constraints=[[[[30, 31]]], [[[32]]], []], continues_word=(False,) * SMALL_VOCAB)
    engine = PyTorchEngine(model, shortlist=holding([4, 5, 6]))
    found = searched(engine, SearchOptions(beam=3, shortlist=True), terms=terms)
    tokens = [hypotheses[0][0] for hypotheses in found]
    assert any(tokens[0][i : i + 2] == [30, 31] for i in range(len(tokens[0]))) and 32 in tokens[1]


def test_a_shortlist_lacking_a_needed_piece_changes_the_output():
    model = transformer()
    full, _ = compared(model, holding(LIKELY), SearchOptions())
    first = full[0][0][0][0]  # the first piece of the first source's translation
    # 16 pieces with the specials, a bucket's size: nothing is added to fill one
    _, cut = compared(model, holding([*(piece for piece in LIKELY if piece != first), 37, 38, 39]), SearchOptions())
    assert cut[0][0][0] != full[0][0][0] and first not in cut[0][0][0]


def test_outputs_hold_only_the_shortlists_pieces_and_the_model_ids():
    model = small_transformer()
    kept = [4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]  # with the specials: a bucket's 16 rows, nothing added
    found = searched(PyTorchEngine(model, shortlist=holding(kept)), SearchOptions(beam=3, nbest=3, shortlist=True))
    assert {token for hypotheses in found for tokens, _ in hypotheses for token in tokens} <= {UNK_ID, *kept}


def test_sampling_draws_from_the_shortlist():
    engine = PyTorchEngine(small_transformer(), shortlist=holding([4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]))
    found = searched(engine, SearchOptions(nbest=4, sampling=Sampling(seed=3, temperature=2.0), shortlist=True))
    assert {token for hypotheses in found for tokens, _ in hypotheses for token in tokens} <= {UNK_ID, *range(4, 16)}


@pytest.mark.parametrize("kind", ["ensemble", "rnn"])
def test_every_architecture_and_ensembles_search_the_same_over_a_covering_shortlist(kind):
    if kind == "ensemble":
        model = Ensemble([transformer(), peaked(small_transformer(output_bias=True, tie_embeddings=False, layers=1))])
    else:
        torch.manual_seed(0)
        model = RNNSeq2Seq(
            SMALL_VOCAB, SMALL_VOCAB, cell="gru", layers=1, hidden_size=32, embed_dim=16, dropout=0.0, tie_embeddings=False
        ).eval()
        model.output.bias = torch.nn.Parameter(torch.zeros(SMALL_VOCAB))
        peaked(model)
    full, cut = compared(model, holding(LIKELY), SearchOptions(beam=3, nbest=2))
    assert cut == full


@pytest.mark.parametrize("packed", [False, True])
def test_output_rows_compute_the_full_layers_logits_of_their_ids(packed):
    torch.manual_seed(0)
    output = torch.nn.Linear(256, 4096).eval()  # a million weights: large enough to be packed
    if packed and not pack_linears(torch.nn.ModuleDict({"output": output})):
        pytest.skip("this torch has no oneDNN")
    features = torch.randn(5, 1, 256)
    for ids in (torch.tensor([3, 7, 8, 30, 4000]), torch.randperm(4096)):  # a few rows; a packed layer's size, permuted
        rows = OutputRows(ids)
        with torch.inference_mode():
            assert torch.allclose(rows.project(output, features), output(features)[..., ids], atol=1e-4)
            assert rows.project(output, features).shape == (5, 1, len(ids))


def test_a_batch_vocabulary_maps_ids_both_ways_and_takes_few_sizes():
    vocabulary = BatchVocabulary.of(holding([9, 20]), [[5]], needed=[31], vocab_size=SMALL_VOCAB, device=torch.device("cpu"))
    assert len(vocabulary.kept) == 8  # 7 needed, grown to a bucket's size with the lowest id left out
    assert {*SPECIALS, 9, 20, 31, 4} == set(vocabulary.kept.tolist())
    assert vocabulary.full(vocabulary.reduced([31, 9, EOS_ID])) == [31, 9, EOS_ID]
    assert vocabulary.present([PAD_ID, 33]) == (vocabulary.reduced([PAD_ID])[0],)


def test_asking_for_a_shortlist_the_model_lacks_is_one_line_and_the_default_follows_the_model():
    bare, held = PyTorchEngine(small_transformer()), PyTorchEngine(small_transformer(), shortlist=holding([4]))
    with pytest.raises(OptionError, match="--shortlist: this model has no vocabulary shortlist; build one with"):
        shortlist_choice(bare, asked=True)
    assert [shortlist_choice(bare, asked=None), shortlist_choice(held, asked=None), shortlist_choice(held, asked=False)] == [
        False,
        True,
        False,
    ]
