"""The fake hub (unit/fake_hub.py) as a fixture of every data test."""

from unit.fake_hub import fake_hub  # noqa: F401 - the fixture
