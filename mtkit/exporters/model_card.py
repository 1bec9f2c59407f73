"""The model card (README.md) of an export: what the model is, how to load it, its data and its measured scores."""

from __future__ import annotations

from pathlib import Path

import yaml

from mtkit.config import Config, SplitConfig, config_to_dict
from mtkit.data.tokenizer import TokenizerPair
from mtkit.importers import RunFamily
from mtkit.importers.marian import MARIAN_TOKENIZER
from mtkit.importers.names import depths
from mtkit.run_files import RunFiles


def model_card(config: Config, model_path: Path, *, tokenizers: TokenizerPair, written: RunFamily | None) -> str:
    """README.md for the Hugging Face Hub: front matter, loading, languages, model, data, scores, recipe; `written`:
    the family whose classes the export holds (None: mtkit's own modeling code)."""
    codes = sorted(tokenizers.src.codes)
    languages = sorted(tokenizers.src.tags) if tokenizers.src.tags else codes or [config.tgt_lang]
    front = {
        "language": sorted({config.src_lang, *languages} - {"src", "tgt"}) or None,
        "library_name": "transformers",
        "pipeline_tag": "translation",
        "tags": ["translation", "mtkit", written.tokenizer.name if written is not None else "custom_code"],
    }
    tagged = languages if tokenizers.src.tags else []
    parts = [
        "---\n" + yaml.safe_dump({k: v for k, v in front.items() if v}, sort_keys=False) + "---",
        f"# {config.name}: {config.src_lang} → {', '.join(languages)}",
        f"A {_architecture(config, tokenizers)} trained with mtkit and exported by "
        f"`mtkit export -m {model_path} --format transformers`.",
        _coded_usage(written, config, codes) if written is not None and codes else _usage(written, tagged),
        _normalisation(config),
        "## Data\n\n" + _data(config),
        "## Scores\n\n" + _scores(RunFiles.of(model_path).read_scores()),
        "## Recipe\n\n```yaml\n" + yaml.safe_dump(config_to_dict(config), sort_keys=False, allow_unicode=True) + "```",
    ]
    return "\n\n".join(part for part in parts if part) + "\n"


def _architecture(config: Config, tokenizers: TokenizerPair) -> str:
    m = config.model
    layers = "{}+{} layers".format(*depths(m))
    vocab = (
        f"a joint vocabulary of {tokenizers.src.vocab_size}"
        if tokenizers.joint
        else (f"vocabularies of {tokenizers.src.vocab_size} / {tokenizers.tgt.vocab_size}")
    )
    return f"{m.norm}-norm Transformer (d_model {m.d_model}, {layers}, {m.heads} heads, feed-forward {m.ffn_dim}, {vocab} pieces)"


def _usage(written: RunFamily | None, languages: list[str]) -> str:
    """Loading a folder of MarianMTModel (`written`: Marian's rows) or of mtkit's own code (None); a multi-target model's
    languages are tokens (>>fr<<) in front of the source, as MarianTokenizer reads them."""
    remote = ", trust_remote_code=True" if written is None else ""
    tokenizer = written.tokenizer if written is not None else MARIAN_TOKENIZER  # mtkit's own code reads its files too
    token = tokenizer.piece(languages[0]) if languages else ""
    text = f"{token} This text".strip()
    how = (
        "## Use\n\n"
        + (
            f"A plain `{written.family.architecture}`: no remote code is needed.\n\n"
            if written is not None
            else "The modeling code ships in this folder (`modeling_mtkit.py`): load both with trust_remote_code=True.\n\n"
        )
        + "```python\nfrom transformers import AutoModelForSeq2SeqLM, AutoTokenizer\n\n"
        + f'tokenizer = AutoTokenizer.from_pretrained("PATH"{remote})\n'
        + f'model = AutoModelForSeq2SeqLM.from_pretrained("PATH"{remote})\n'
        + f'batch = tokenizer(["{text}"], return_tensors="pt", padding=True)\n'
        + "print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))\n```"
    )
    if languages:
        how += (
            f"\n\nThe model translates into {', '.join(languages)}: start each source with the target language's token, "
            f"such as `{token}`."
        )
    return how


def _coded_usage(written: RunFamily, config: Config, codes: list[str]) -> str:
    """Loading an export of a model with language codes (NLLB-200, M2M-100, mBART-50): the source's code set on the
    tokenizer, the target's (as its tokenizer class writes it) forced."""
    model_class, tokenizer_class = written.family.architecture, written.tokenizer.class_name
    target = config.tgt_lang if config.tgt_lang in codes else next((code for code in codes if code != config.src_lang), codes[0])
    token = written.tokenizer.piece(target)
    return (
        f"## Use\n\nA plain `{model_class}` with its `{tokenizer_class}`: no remote code is needed. The source's "
        "language is the tokenizer's `src_lang`; the target's code is the first token generate() is forced to.\n\n"
        "```python\nfrom transformers import AutoModelForSeq2SeqLM, AutoTokenizer\n\n"
        f'tokenizer = AutoTokenizer.from_pretrained("PATH", src_lang="{config.src_lang}")\n'
        'model = AutoModelForSeq2SeqLM.from_pretrained("PATH")\n'
        'batch = tokenizer(["This text"], return_tensors="pt", padding=True)\n'
        f'out = model.generate(**batch, forced_bos_token_id=tokenizer.convert_tokens_to_ids("{token}"))\n'
        "print(tokenizer.batch_decode(out, skip_special_tokens=True))\n```\n\n"
        f"Its language codes: {', '.join(codes)}."
    )


def _normalisation(config: Config) -> str:
    if config.data.normalize == "none":
        return ""
    return (
        f"mtkit applies Unicode {config.data.normalize} to the text before SentencePiece; the tokenizer here does "
        f'not, so normalise input the same way (`unicodedata.normalize("{config.data.normalize}", text)`).'
    )


def _data(config: Config) -> str:
    rows = [("train", source) for source in config.data.train]
    rows += [("valid", split) for split in config.data.valid] + [("test", split) for split in config.data.test or []]
    return "\n".join(f"- {split}: {_where(source)}" for split, source in rows)


def _where(split: SplitConfig) -> str:
    given = split.hf or split.src or split.tsv or split.jsonl or split.tmx or "?"
    named = getattr(split, "name", None)
    return f"{named} ({Path(given).name})" if named else str(given)


def _scores(scores: dict | None) -> str:
    if not scores:
        return "Not measured yet: `mtkit evaluate -m RUN --split test` records them before an export."
    lines = ["| split | metric | score | signature |", "| --- | --- | --- | --- |"]
    for split, found in scores.items():
        signatures = found.get("signatures", {})
        lines += [
            f"| {split} | {name} | {score} | `{signatures.get(name, '')}` |"
            for name, score in found.items()
            if name != "signatures"
        ]
    return "\n".join(lines)
