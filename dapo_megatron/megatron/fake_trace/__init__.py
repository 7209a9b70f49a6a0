"""The memory tracer's rank side: one policy rank's real Megatron step on a fake CUDA device.

device.py (the fake device), kernels.py (stand-ins for the GPU spec's Transformer Engine and
flash kernels), census.py (live device bytes by category), rank.py (build and step one rank).
Runs only in a process of its own, started by dapo_megatron/planning/trace/launch.py with the
fake-CUDA shim preloaded; nothing else imports it.
"""
