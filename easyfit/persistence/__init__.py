"""Persistence: what outlives a process.

Orbax checkpoints of plain values (``checkpoint.py``), the files that make a checkpoint directory
safe to write, trust and replace (``checkpoint_files.py``: checksums, the writer lock, the atomic
swap, the marker files that say what easyfit owns), and ``jax.export`` of a trained model
(``export.py``).
"""
