"""Helpers the tests import as ``from helpers.<module> import ...`` (``tests/`` is not a package:
pytest's default import mode puts it first on ``sys.path``). Fixtures and hooks stay in
``tests/conftest.py``.

- :mod:`helpers.project`: the repository root, commands checked with their output, a throwaway
  git + DVC copy of the pipeline, a reduced params.yaml.
- :mod:`helpers.archives`: small archives in the published formats of the four real datasets.
- :mod:`helpers.servers`: local HTTP servers on 127.0.0.1 that misbehave on purpose.
- :mod:`helpers.evaluation`: ``evaluate.backend: auto`` forced onto either CPU path.
"""
