"""Every peer config in tests/data/foreign through dapo-import-config and dapo-plan:
bench/results/import_survey.json.

    python bench/import_survey.py [--json PATH]

Each file is imported as a migrating user would, with no hand edit: `dapo-import-config
--from SYSTEM FILE -o RECIPE --shell-var HOME=/home/user` (a launch script's $HOME is the
user's; no other variable is supplied). The outcome of a file is one of

- plans: written (exit 0) and its memory plan fits at the source's node count;
- not planned: written, but no architecture is known for its model;
- does not fit: written (exit 1), the plan's line says which phase and setting;
- refused: nothing written (exit 2), the features it needs that we lack.

A refused file is imported again with --allow-untranslated to show what the named gaps
leave (plans_with_gaps). The baseline of the ratio is the set itself: the share of files that
plan with no hand edit, over all files and over the files for Megatron-backed runs (the
file names Megatron: `megatron` in its text). Exit status 0; the JSON is the record.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "foreign"
OUT = ROOT / "bench" / "results" / "import_survey.json"
SHELL_VARS = ("HOME=/home/user",)


def peer_files() -> list[Path]:
    """Every config and launch script kept as a peer's file (SOURCES.md cites each)."""
    return sorted(p for p in DATA.rglob("*") if p.suffix in (".yaml", ".yml", ".sh"))


def _run(argv: list[str]) -> tuple[int, str, str]:
    from dapo_megatron.migrate.import_config import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse
            rc = int(e.code or 0)
    return rc, out.getvalue(), err.getvalue()


def _plan_line(stdout: str) -> str:
    found = re.findall(r"^dapo-plan: (.*)$", stdout, flags=re.M)
    return found[-1] if found else ""


def survey_file(path: Path, work: Path) -> dict[str, object]:
    dialect = path.relative_to(DATA).parts[0]
    recipe = work / (path.stem + ".yaml")
    base = ["--from", dialect, str(path), "-o", str(recipe), "--force"]
    for var in SHELL_VARS:
        base += ["--shell-var", var]
    started = time.perf_counter()
    rc, stdout, stderr = _run(base)
    row: dict[str, object] = {
        "dialect": dialect,
        "file": str(path.relative_to(DATA)),
        "megatron": "megatron" in path.read_text(encoding="utf-8").lower(),
        "exit": rc,
        "plan": _plan_line(stdout),
        "refused": "",
        "plans_with_gaps": None,
    }
    if rc == 0:
        row["outcome"] = "plans" if "memory: fits" in str(row["plan"]) else "not planned"
    elif rc == 1:
        row["outcome"] = "does not fit"
    else:
        row["outcome"] = "refused"
        row["refused"] = stderr.strip().splitlines()[-1] if stderr.strip() else ""
        rc2, stdout2, _ = _run([*base, "--allow-untranslated"])
        row["plans_with_gaps"] = rc2 == 0 and "memory: fits" in _plan_line(stdout2)
    row["import_s"] = round(time.perf_counter() - started, 3)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=OUT, help=f"output (default {OUT})")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in peer_files():
            row = survey_file(path, Path(tmp))
            rows.append(row)
            print(f"{row['outcome']:13} {row['file']}", flush=True)
    summary: dict[str, object] = {}
    for name, subset in (("all", rows), ("megatron", [r for r in rows if r["megatron"]])):
        counts = Counter(str(r["outcome"]) for r in subset)
        share = counts["plans"] / len(subset) if subset else 0.0
        summary[name] = {"files": len(subset), **dict(counts), "share_plans": round(share, 3)}
        print(
            f"{name}: {counts['plans']} of {len(subset)} files plan with no hand edit "
            f"({share:.0%}); " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        )
    by_system = {
        d: dict(Counter(str(r["outcome"]) for r in rows if r["dialect"] == d))
        for d in sorted({str(r["dialect"]) for r in rows})
    }
    for d, counts in by_system.items():
        print(f"  {d}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    record = {"shell_vars": list(SHELL_VARS), "summary": summary, "by_system": by_system}
    args.json.write_text(json.dumps({**record, "files": rows}, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
