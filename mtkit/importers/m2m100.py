"""Import Hugging Face M2M-100 and NLLB-200 checkpoints (transformers' `M2M100ForConditionalGeneration`).

Both are fairseq's pre-norm Transformer with final layer norms, scaled embeddings tied to the output, a
ReLU feed-forward and fairseq's sinusoids (`positions: sinusoidal_fairseq`); they differ only in their
tokenizer files (NLLB's tokenizer.json, M2M-100's vocab.json) and codes, which fairseq.py reads, and in their
tokenizer class, which the run records.
"""

from __future__ import annotations

from mtkit.importers.fairseq import FairseqNames, FairseqSettings, fairseq_family
from mtkit.importers.names import TokenizerFamily

# M2M100Tokenizer: vocab.json, its codes (__de__) named by tokenizer_config.json's language_codes, made-up words
M2M100_TOKENIZER = TokenizerFamily(name="m2m100", class_name="M2M100Tokenizer", code="__{}__", vocab_json=True, english="en")
# NllbTokenizer: the SentencePiece pieces but fairseq's four specials, then its codes (deu_Latn) and <mask>, listed in
# tokenizer_config.json
NLLB_TOKENIZER = TokenizerFamily(
    name="nllb", class_name="NllbTokenizer", code="{}", added_tokens=True, drops_specials=True, english="eng_Latn"
)

M2M100 = fairseq_family(
    FairseqSettings(positions="sinusoidal_fairseq", embedding_norm=False, scale_embedding=True),  # M2M100Config's
    FairseqNames(
        name="m2m100",
        title="M2M-100 or NLLB-200",
        model_type="m2m_100",
        architecture="M2M100ForConditionalGeneration",
        tokenizers=(M2M100_TOKENIZER, NLLB_TOKENIZER),
        example="facebook/nllb-200-distilled-600M",
    ),
    export_keys={},
    logits_bias=False,  # M2M100ForConditionalGeneration has no output bias
)
