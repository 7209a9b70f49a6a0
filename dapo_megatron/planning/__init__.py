"""Everything decided before a worker starts: the printed run summary, the per-GPU memory
model (memory.py adds up memory_terms.py and refit_memory.py), and the pre-flight checks
of the files and devices a recipe names. Pure arithmetic and file checks; no torch at import."""
