"""Documents, not lines: the stage between the front ends (CLI, server, evaluation) and the translator.

A format (`formats.FORMATS`) reads a file into blocks of plain text with their inline markup (`blocks.Block`)
and writes the translated blocks back; the pipeline (`pipeline.translate_blocks`) masks placeholders, splits
each block into sentences, translates them with word alignments and puts the markup back around the words
its source words align to. The translator and the engines only ever see plain sentences.
"""
