"""How a model is told which language to write: mtkit's target-language tags (`data.lang_tag: target`, a
reserved piece <2xx> in front of the source), or the language codes of an imported M2M-100, NLLB-200 or
mBART-50 model (`data.lang_tag: code`).

Such a model reads its source after the source language's code and writes its translation after the
target language's: the decoder starts from </s> (mtkit's BOS takes its row) and its first token is
forced to the target code, at log-probability 0 as transformers' `forced_bos_token_id` forces it.
`--src-lang` and `--tgt-lang` name a code as the model does (deu_Latn, de for M2M-100's __de__, de_DE),
or by its ISO 639-1 code where that names one code only (de for deu_Latn or de_DE); a code the model
lacks is one line naming the closest codes it has.
"""

from __future__ import annotations

from mtkit.config import Config, split_languages, target_languages
from mtkit.data.language_codes import code_id
from mtkit.data.tokenizer import TokenizerPair
from mtkit.errors import OptionError


class Languages:
    """The languages a loaded model reads and writes, from its recipe (None: an engine alone) and tokenizers."""

    def __init__(self, config: Config | None, tokenizers: TokenizerPair) -> None:
        self.config, self.tokenizers = config, tokenizers
        self.tagged = config is not None and config.data.lang_tag == "target"  # every source starts with a tag
        self.coded = config is not None and config.data.lang_tag == "code"  # sources and outputs start with codes

    @property
    def targets(self) -> list[str]:
        """The languages this model writes: several for a tagged model, its codes for a model with codes, else its
        recipe's one."""
        if self.coded:
            return list(self.tokenizers.tgt.codes)
        return target_languages(self.config) if self.config is not None else []

    def leads(self, src_lang: str | None, tgt_lang: str | None) -> tuple[int | None, list[int]]:
        """What every source starts with (a tag, a language code, or nothing: None) and what every translation must
        start with (a language code, or nothing), for these languages or else the recipe's."""
        if not self.coded or self.config is None:
            self._check_uncoded_source(src_lang)
            return self.tag(tgt_lang), []
        codes = self.tokenizers.tgt.codes
        if tgt_lang is None and self.config.tgt_lang not in codes:  # the import found no target language to default to
            example = next((code for code in ("fra_Latn", "fr_XX", "fr") if code in codes), next(iter(codes)))
            raise OptionError(
                "tgt_lang",
                "this model writes {count} languages: choose one with {tgt_lang}, such as {tgt_lang} {example}",
                count=len(codes),
                example=example,
            )
        source = code_id(codes, src_lang or self.config.src_lang, option="src_lang")
        return source, [code_id(codes, tgt_lang or self.config.tgt_lang, option="tgt_lang")]

    def _check_uncoded_source(self, src_lang: str | None) -> None:
        """A source language named to a model without language codes: nothing tells the model which it reads, so
        only a language it was trained to read is taken (as a no-op); any other would be ignored silently."""
        config = self.config
        sources = list(dict.fromkeys(split_languages(config, split)[0] for split in config.data.train)) if config else []
        if src_lang is not None and src_lang not in sources:
            reads = f" (it reads {', '.join(sources)})" if sources else ""
            raise OptionError(
                "src_lang",
                "{src_lang} {value}: this model has no language codes to be told its source's language{reads}; leave "
                "{src_lang} out (it is read by an imported NLLB-200, M2M-100 or mBART-50 model)",
                value=src_lang,
                reads=reads,
            )

    def tag(self, tgt_lang: str | None) -> int | None:
        """The id a source starts with to be translated into `tgt_lang`: its tag (None: an untagged model), or the
        recipe's source-language code; a language the model does not write, or none for a model of several, is an
        error listing the valid ones."""
        if self.coded:
            return self.leads(None, tgt_lang)[0]
        languages = self.targets
        if tgt_lang is None and self.tagged and len(languages) > 1:
            raise OptionError(
                "tgt_lang",
                "this model translates into {languages}: choose one with {tgt_lang}, such as {tgt_lang} {first}",
                languages=", ".join(languages),
                first=languages[0],
            )
        if tgt_lang is not None and languages and tgt_lang not in languages:
            raise OptionError(
                "tgt_lang",
                "{tgt_lang} {value}: this model translates into {languages} only; give one of them",
                value=tgt_lang,
                languages=", ".join(languages),
            )
        if not self.tagged:
            return None
        lang = tgt_lang or languages[0]
        if lang not in self.tokenizers.src.tags:
            raise OptionError(
                "tgt_lang",
                "{tgt_lang} {value}: the model's tokenizer has no tag for it; the model cannot be told to write it",
                value=lang,
            )
        return self.tokenizers.src.tags[lang]
