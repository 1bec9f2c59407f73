"""Word alignments from eflomal: of a corpus, and of new pairs guided by the priors a corpus gives.

mtkit aligns in two places. A vocabulary shortlist counts the links of a training corpus's SentencePiece
pieces (`data.shortlist`). Inline tags are placed over the words eflomal aligns a source with its translation
(`documents.aligner`): a few sentences alone teach an aligner little, so it reads the priors
(`corpus_priors`) learnt from the run's training corpus (`mtkit priors RUN`), as mozilla/translations aligns
new text with the priors of its corpus. Words there are `TOKEN` matches: a word or one punctuation mark.

eflomal is the optional dependency `mtkit[align]`; it is imported where it is used.
"""

from __future__ import annotations

import io
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

from mtkit.errors import MtkitError

TOKEN = re.compile(r"\w+|[^\w\s]")  # a word or one punctuation mark: what word alignment links
NEIGHBOURS = ((-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))
Links = set[tuple[int, int]]  # (source token, target token)


def eflomal_links(
    sources: Sequence[Sequence[str]],
    targets: Sequence[Sequence[str]],
    *,
    priors: str | None = None,
    quick: bool = False,
) -> list[tuple[Links, Links]]:
    """eflomal's two alignments, forward and reverse, of each pair of token sequences (pairs with an empty side get
    none). `priors`: eflomal's priors text (`corpus_priors`); `quick`: one sampler and a third of its iterations, for
    a few pairs guided by priors."""
    try:
        from eflomal import Aligner
    except ImportError:
        raise MtkitError("word alignment needs the eflomal aligner: pip install 'mtkit[align]'") from None

    kept = [n for n, (source, target) in enumerate(zip(sources, targets, strict=True)) if source and target]
    found: list[tuple[Links, Links]] = [(set(), set()) for _ in sources]
    if not kept:
        return found
    aligner = Aligner(n_samplers=1, rel_iterations=0.3) if quick else Aligner()
    with tempfile.TemporaryDirectory(prefix="mtkit-align-") as scratch:
        forward, reverse = Path(scratch, "forward"), Path(scratch, "reverse")
        aligner.align(
            [" ".join(sources[n]) + "\n" for n in kept],
            [" ".join(targets[n]) + "\n" for n in kept],
            links_filename_fwd=str(forward),
            links_filename_rev=str(reverse),
            priors_input=io.StringIO(priors) if priors is not None else None,
        )
        lines = zip(forward.read_text().splitlines(), reverse.read_text().splitlines(), strict=True)
        for n, (ahead, back) in zip(kept, lines, strict=True):
            found[n] = (pharaoh_links(ahead), pharaoh_links(back))
    return found


def pharaoh_links(line: str) -> Links:
    """`0-0 1-2 ...` read back."""
    return {(int(i), int(j)) for i, _, j in (pair.partition("-") for pair in line.split())}


def symmetrized(forward: Links, reverse: Links) -> Links:
    """grow-diag-final-and (Koehn et al., 2005): the links both directions agree on, grown into their neighbours
    from either direction that align a word not yet aligned, then the rest of either whose two words are both free."""
    union, links = forward | reverse, forward & reverse

    def free(i: int, j: int) -> bool:
        return all(i != a for a, _ in links) or all(j != b for _, b in links)

    grew = True
    while grew:
        grew = False
        for i, j in sorted(links):
            for di, dj in NEIGHBOURS:
                link = (i + di, j + dj)
                if link in union and link not in links and free(*link):
                    links.add(link)
                    grew = True
    for i, j in sorted(forward - links) + sorted(reverse - links):
        if all(i != a for a, _ in links) and all(j != b for _, b in links):
            links.add((i, j))
    return links


def text_tokens(text: str) -> list[str]:
    """The tokens of `text` as alignment reads them, lowercased."""
    return TOKEN.findall(text.lower())


def corpus_priors(sources: Sequence[str], targets: Sequence[str]) -> str:
    """eflomal's priors text (lexical, fertility and jump counts) from its alignment of a parallel corpus."""
    source_tokens, target_tokens = [text_tokens(s) for s in sources], [text_tokens(t) for t in targets]
    links = eflomal_links(source_tokens, target_tokens)  # without eflomal: the one-line error
    from eflomal import calculate_priors, write_priors

    text = io.StringIO()
    write_priors(
        text,
        *calculate_priors(
            [" ".join(tokens) for tokens in source_tokens],
            [" ".join(tokens) for tokens in target_tokens],
            [" ".join(f"{i}-{j}" for i, j in sorted(ahead)) for ahead, _ in links],
            [" ".join(f"{i}-{j}" for i, j in sorted(back)) for _, back in links],
        ),
    )
    return text.getvalue()
