"""Hub models (``Org/Name``, data/hub.py) against a local fake hub (unit/fake_hub.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dapo_megatron.data import hub
from unit.fake_hub import FakeHub, add_model

# ----------------------------------------------------------------------------- models


def test_hub_model_is_downloaded_complete_once(fake_hub: FakeHub) -> None:
    add_model(fake_hub)
    snapshot = hub.fetch_model("fake-org/Tiny-Model", what="policy.model_name_or_path")
    assert (snapshot / "config.json").is_file() and (snapshot / "model.safetensors").is_file()
    assert (snapshot / "tokenizer.json").is_file()
    assert hub.fetch_model("fake-org/Tiny-Model", what="k") == snapshot
    assert len(fake_hub.downloads) == 1  # the second found it complete in the cache


def test_incomplete_cached_model_is_downloaded_again(fake_hub: FakeHub) -> None:
    add_model(fake_hub)
    # Validation fetched config.json alone: not a model a run can load.
    fake_hub.download("fake-org/Tiny-Model", "model", ["config.json"], fake_hub.cache)
    snapshot = hub.fetch_model("fake-org/Tiny-Model", what="k")
    assert hub.model_snapshot_complete(snapshot)


def test_local_looking_paths_are_not_hub_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert hub.is_hub_model_id("Qwen/Qwen3-8B")
    (tmp_path / "models").mkdir()
    assert not hub.is_hub_model_id("models/Qwen3-8B")  # a local folder to be filled
    assert not hub.is_hub_model_id("/abs/Qwen3-8B") and not hub.is_hub_model_id("a/b/c")
