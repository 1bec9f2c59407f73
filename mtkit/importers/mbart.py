"""Import Hugging Face mBART-50 checkpoints (transformers' `MBartForConditionalGeneration`).

fairseq's pre-norm Transformer with learned positions (transformers' table has two rows before position
0, which the import leaves out), a LayerNorm on the embeddings (`embedding_norm: true`), GELU, and a
bias on the output logits; its tokenizer and weights are read as M2M-100's are (fairseq.py).
"""

from __future__ import annotations

from mtkit.importers.fairseq import FairseqNames, FairseqSettings, fairseq_family
from mtkit.importers.names import TokenizerFamily

# MBart50Tokenizer: the SentencePiece pieces, then its codes (de_DE) and <mask>; the hub's folders name its
# bos_token (CTranslate2's converter reads it)
MBART50_TOKENIZER = TokenizerFamily(
    name="mbart", class_name="MBart50Tokenizer", code="{}", settings={"bos_token": "<s>"}, english="en_XX"
)

MBART = fairseq_family(
    FairseqSettings(positions="learned", embedding_norm=True, scale_embedding=False),  # MBartConfig's defaults
    FairseqNames(
        name="mbart",
        title="mBART-50",
        model_type="mbart",
        architecture="MBartForConditionalGeneration",
        tokenizers=(MBART50_TOKENIZER,),
        example="facebook/mbart-large-50-many-to-many-mmt",
    ),
    # what mBART-50's own config.json says of its layout, and CTranslate2's converter reads
    export_keys={"normalize_before": True, "add_final_layer_norm": True, "normalize_embedding": True},
    logits_bias=True,  # final_logits_bias
)
