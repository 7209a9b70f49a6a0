"""Where NCCL and gloo, or the CUDA allocator and the CPU, behave differently: every
collective the package issues (collectives.py) and the hand-back of cached CUDA memory at
a colocated phase change (memory_release.py). Imports torch only."""
