"""English->German translation data: the corpus builder (Debian packages or your own TSV) and the tokenizer trainer.

- ``python -m model.translation.corpus``: writes ``data/translation/{train,valid,test}.tsv`` + ``stats.json``.
- ``python -m model.translation.tokenizer``: trains the shared SentencePiece model on ``train.tsv``.

The tokenizer class itself is ``contract.tokenizer.Tokenizer`` (torch-free, so the service loads it too).
"""
