"""The modeling code shipped with a `transformers` export of a model MarianMTModel cannot represent.

`mtkit export --format transformers` copies `configuration_mtkit.py` and `modeling_mtkit.py` into the export folder,
whose config.json maps `AutoConfig` and `AutoModelForSeq2SeqLM` to them (`auto_map`), so
`AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True)` builds mtkit's Transformer under mtkit's
own parameter names. They run without mtkit installed: they import only torch, transformers and each other
(relatively), and nothing in mtkit imports them.
"""
