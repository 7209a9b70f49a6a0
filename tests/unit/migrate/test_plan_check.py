"""The plan of an imported recipe (migrate/plan_check.py) and dapo-import-config's verdict:
the written recipe is planned at its own node count on the card --gpu-mem names."""

from __future__ import annotations

from pathlib import Path

from dapo_megatron.migrate.import_config import main as import_main
from dapo_megatron.migrate.plan_check import check_plan

REPO = Path(__file__).resolve().parents[3]
NEMO = REPO / "tests" / "data" / "foreign" / "nemo-rl" / "recipes" / "llm"


def test_a_shipped_recipe_plans_as_dapo_plan_does():
    verdict = check_plan(REPO / "recipes" / "dapo-qwen2.5-32b-16n8g-tp8pp1cp2.yaml")
    assert verdict.fits is True
    assert verdict.line.startswith("TP8 PP1 CP2 DP8 +SP on 16 node(s) of h100-80gb")
    cpu = check_plan(REPO / "recipes" / "dapo-tiny-cpu.yaml")
    assert cpu.fits is True and cpu.line.endswith("(a CPU recipe)")


def test_the_source_clusters_card_decides_the_verdict(tmp_path, capsys):
    """NeMo RL's 4n4g recipes run on 4-GPU nodes of larger cards: Qwen2.5-7B at DP16 with
    TP1 needs more than an 80 GB card holds in training, and fits one of 184 GiB."""
    src = NEMO / "grpo-qwen2.5-7b-instruct-4n4g-megatron.yaml"
    out = tmp_path / "r.yaml"
    assert import_main(["--from", "nemo-rl", str(src), "-o", str(out)]) == 1
    printed = capsys.readouterr()
    assert "of h100-80gb" in printed.out and "DOES NOT FIT" in printed.out
    assert "was written but does not fit" in printed.err
    argv = ["--from", "nemo-rl", str(src), "-o", str(out), "--force", "--gpu-mem", "184"]
    assert import_main(argv) == 0
    assert "on 4 node(s) of 184 GiB: memory: fits" in capsys.readouterr().out


def test_a_bad_card_is_one_line_before_anything_is_read(tmp_path, capsys):
    argv = ["--from", "verl", "missing.sh", "-o", str(tmp_path / "r.yaml"), "--gpu-mem", "x"]
    assert import_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--gpu-mem" in err[0] and not (tmp_path / "r.yaml").exists()
