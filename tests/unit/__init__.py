"""Unit tests, laid out as the package they test: tests/unit/<package>/test_<module>.py holds
the tests of dapo_megatron/<package>/<module>.py (test_layout.py checks it).

tests/unit is the package ``unit`` (tests/ is on sys.path, as for tests/conftest.py's own
imports), so test files in different directories may share a basename, and the shared
helpers import as ``unit.fake_context``, ``unit.sampler_rounds``, ``unit.fake_hub``. Run
pytest from the repository root: ``python -m pytest`` started inside tests/unit would put
tests/unit first on sys.path, where its logging/ and megatron/ packages hide the real ones.
"""
