"""The command line (dapo_megatron/cli.py): dry runs, printed and saved configs, user
errors without tracebacks, the help text."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dapo_megatron.config import load_config
from dapo_megatron.config.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "recipes" / "dapo-tiny-cpu.yaml"


# ---------------------------------------------------------------------------------------
# The command line


def run_cli(*args: str) -> subprocess.CompletedProcess:
    code = "import sys; from dapo_megatron.cli import train_main; sys.exit(train_main())"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO, timeout=120
    )


def test_cli_dry_run_validates_tiny_recipe():
    out = run_cli("--config", str(TINY), "--dry-run")
    assert out.returncode == 0, out.stderr
    assert (
        "TP1 PP1 CP1 DP2" in out.stdout
        and "dry run: configuration, data, model, tokenizer and devices are valid" in out.stdout
    )


def test_cli_print_config_is_the_resolved_config():
    out = run_cli("--config", str(TINY), "dapo.loss.clip_ratio_high=0.31", "--print-config")
    assert out.returncode == 0, out.stderr
    printed = yaml.safe_load(out.stdout)
    expected = dataclasses.asdict(load_config(TINY, ["dapo.loss.clip_ratio_high=0.31"]).config)
    expected["policy"]["megatron"]["data_parallel_size"] = 2  # derived: world 2 / (1*1*1)
    assert printed == expected
    assert printed["dapo"]["loss"]["clip_ratio_high"] == 0.31


def test_cli_user_error_has_no_traceback():
    out = run_cli("--config", str(TINY), "dapo.loss.clip_ratio_low=-1")
    assert out.returncode == 2
    assert out.stderr.startswith("error: ") and "Traceback" not in out.stderr
    out = run_cli("--config", "does/not/exist.yaml")
    assert out.returncode == 2 and "does/not/exist.yaml not found" in out.stderr


def test_the_run_directory_keeps_a_resolved_config_that_loads_back(tmp_path):

    from dapo_megatron.cli import RUN_CONFIG_FILE, _write_resolved_config

    loaded = load_config(REPO / "recipes" / "dapo-tiny-cpu.yaml", ["dapo.loss.clip_ratio_high=0.3"])
    _write_resolved_config(loaded, tmp_path / "run")
    again = load_config(tmp_path / "run" / RUN_CONFIG_FILE).config
    # Identical, except that the derived data-parallel size is now written out.
    expected = dataclasses.replace(
        loaded.config,
        policy=dataclasses.replace(
            loaded.config.policy,
            megatron=dataclasses.replace(loaded.config.policy.megatron, data_parallel_size=2),
        ),
    )
    assert again == expected and again.dapo.loss.clip_ratio_high == 0.3
    assert not list((tmp_path / "run").glob("*.tmp"))


def test_train_help_names_the_related_commands(capsys):
    from dapo_megatron.cli import train_main

    with pytest.raises(SystemExit) as exited:
        train_main(["--help"])
    assert exited.value.code == 0
    help_text = capsys.readouterr().out
    related = help_text.split("related commands:")[1]
    for command in ("dapo-plan", "dapo-prepare", "dapo-import-config", "dapo-export"):
        assert f"\n  {command} " in related, command


# ---------------------------------------------------------------------------------------
# Issue 30 case 10: ``--config`` naming a directory.


def test_config_naming_a_directory_says_so() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "dapo_megatron.cli", "--config", "recipes", "--dry-run"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0"),
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        "error: --config recipes is a directory; pass a recipe YAML file, e.g. "
        "--config recipes/dapo-tiny-cpu.yaml"
    ]


def test_a_run_saved_before_a_key_was_added_still_loads(tmp_path):
    """dapo-export reads RUN_DIR/config.yaml: a run written before policy.scheduler.unit and
    dapo.advantage.std_over existed lacks them; they take the base's values (the behaviour
    the run had), while a key the package no longer has is still refused by name."""
    import yaml

    from dapo_megatron.cli import load_saved_config, resolved_config_yaml
    from dapo_megatron.config.loader import load_config

    loaded = load_config(REPO / "recipes" / "dapo-tiny-cpu.yaml", ["dapo.max_num_steps=7"])
    tree = yaml.safe_load(resolved_config_yaml(loaded))
    del tree["policy"]["scheduler"]["unit"]
    del tree["dapo"]["advantage"]["std_over"]
    saved = tmp_path / "config.yaml"
    saved.write_text(yaml.safe_dump(tree, sort_keys=False))
    with pytest.raises(
        ConfigError, match="missing key (policy.scheduler.unit|dapo.advantage.std_over)"
    ):
        load_config(saved, validate=False)  # what dapo-export did before
    old = load_saved_config(saved).config
    assert old.policy.scheduler.unit == "optimizer_step"
    assert old.dapo.advantage.std_over == "group"
    assert old.dapo.max_num_steps == 7  # the run's own values win
    tree["policy"]["scheduler"]["gone_key"] = 1
    saved.write_text(yaml.safe_dump(tree, sort_keys=False))
    with pytest.raises(ConfigError, match="gone_key"):
        load_saved_config(saved)
