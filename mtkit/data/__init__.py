"""Data: reading corpora, cleaning and deduplication, SentencePiece tokenizers, `prepare`, and the prepared store."""
