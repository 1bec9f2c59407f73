"""The server's `shortlist` request field: on by default where the model has a shortlist, off when asked, refused in one
line where the model has none; the translations are the same either way on the reverse task."""

from __future__ import annotations

import numpy as np
from helpers import REVERSE_PROBES, reverse, serving, translate

from mtkit.data.shortlist import Shortlist
from mtkit.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from mtkit.decoding.engine import PyTorchEngine
from mtkit.decoding.translator import Translator
from mtkit.serving.app import ServeLimits


def with_shortlist(translator: Translator) -> Translator:
    """The translator's model with a shortlist keeping each source piece itself (the reverse task needs nothing else)."""
    vocab = translator.tokenizers.tgt.vocab_size
    shortlist = Shortlist(
        candidates=np.arange(vocab).reshape(-1, 1),
        frequent=np.array([PAD_ID, UNK_ID, BOS_ID, EOS_ID]),
        target_vocab=vocab,
        info={},
    )
    engine = PyTorchEngine(translator.engine.model, shortlist=shortlist)
    return Translator(engine, translator.tokenizers, decode=translator.decode, config=translator.config)


def test_the_shortlist_field_turns_it_on_and_off_and_is_refused_where_there_is_none(reverse_pytorch):
    expected = [reverse(line) for line in REVERSE_PROBES]
    with serving(with_shortlist(reverse_pytorch), ServeLimits()) as (port, _):
        for shortlist in (None, True, False):
            fields = {} if shortlist is None else {"shortlist": shortlist}
            reply = translate(port, REVERSE_PROBES, beam=3, **fields)
            assert reply.status == 200, reply.body
            assert reply.body["translations"] == expected
    with serving(reverse_pytorch, ServeLimits()) as (port, _):
        reply = translate(port, ["a b c"], shortlist=True)
        assert reply.status == 400
        assert reply.body["detail"].startswith("shortlist: this model has no vocabulary shortlist; build one with")
        assert translate(port, ["a b c"], shortlist=False).status == 200
