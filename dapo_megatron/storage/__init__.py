"""The run directory on disk: its exclusive lock (run_dir.py) and the names, completion
markers, discovery and pruning of checkpoint directories (checkpoint_dirs.py). Stdlib only,
so the controller can use it without importing torch or Megatron."""
