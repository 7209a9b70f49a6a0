"""The end-of-session clean-up removes only new, unused files of the kinds it knows."""

from __future__ import annotations

import mmap

import shm_hygiene


def test_only_new_unused_files_of_known_kinds_are_removed(tmp_path) -> None:
    old = tmp_path / "psm_old"
    old.write_bytes(b"x")
    before = shm_hygiene.ours(tmp_path)
    assert before == {"psm_old"}
    leaked = [tmp_path / n for n in ("psm_1", "vllm_dist_2", "sem.mp-3", "dapo-refit-4")]
    for path in leaked:
        path.write_bytes(b"x" * 16)
    foreign = tmp_path / "someone-elses"
    foreign.write_bytes(b"x")
    held = tmp_path / "dapo-refit-held"
    held.write_bytes(b"y" * 4096)
    mapped = tmp_path / "psm_mapped"
    mapped.write_bytes(b"z" * 4096)
    with open(held, "rb") as handle, open(mapped, "r+b") as file:
        view = mmap.mmap(file.fileno(), 0)
        file.close()  # only the mapping is left: found through /proc/self/maps
        removed = shm_hygiene.remove_leftovers(before, tmp_path)
        assert sorted(removed) == sorted(p.name for p in leaked)
        assert handle.read(1) == b"y"
        view.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "dapo-refit-held",
        "psm_mapped",
        "psm_old",
        "someone-elses",
    ]
