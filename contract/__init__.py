"""What training, export and serving agree on, importable by all three and importing none of them.

- :mod:`contract.manifest`: the model repository (``<name>/<version>/manifest.json`` and its files).
- :mod:`contract.tokenizer`: the translator's tokenizer, its text normalisation and special ids.
- :mod:`contract.decoding`: how the translator's graphs are driven (decoder spec, greedy and beam
  search in numpy), shared by the exporter's parity check and the service's scheduler.

Nothing here imports torch, ``model``, ``export`` or ``service``; ``tests/test_imports.py`` checks it.
"""
