"""``python -m dapo_megatron.megatron.fake_trace SPEC_JSON OUT_JSON``: trace one rank (rank.py)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from dapo_megatron.megatron.fake_trace.rank import TraceSpec, trace_rank


def main(argv: list[str]) -> int:
    spec_path, out_path = argv
    raw = json.loads(Path(spec_path).read_text())
    spec = TraceSpec(**{**raw, "overrides": tuple(raw.get("overrides", ()))})
    result = trace_rank(spec)
    Path(out_path).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # Autograd started worker threads for the fake CUDA devices; a CPU build's engine does
    # not join them at interpreter exit, which can abort the process after its result is
    # written ("terminate called without an active exception"). Nothing is left to clean.
    os._exit(code)
