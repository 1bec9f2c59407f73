"""`mtkit serve` over HTTP takes the target language per request (the tagged copy/reverse run, `tagged_run`)."""

from __future__ import annotations

from helpers import request, serving, translate

from mtkit.decoding.translator import Translator


def test_the_server_takes_the_target_language_per_request(tagged_run):
    from mtkit.serving.app import ServeLimits

    with serving(Translator.load(tagged_run.run_path), ServeLimits()) as (port, _):
        info = request(port, "GET", "/info").body
        assert info["target_languages"] == ["cp", "rv"] and info["needs_tgt_lang"]
        assert translate(port, ["a b c"], tgt_lang="rv").body["translations"] == ["c b a"]
        assert translate(port, ["a b c"], tgt_lang="cp").body["translations"] == ["a b c"]
        missing = translate(port, ["a b c"])
        assert missing.status == 400 and "translates into cp, rv" in missing.body["detail"]
        unknown = translate(port, ["a b c"], tgt_lang="de")
        assert unknown.status == 400 and "cp, rv only" in unknown.body["detail"]
