"""The runner: ``python -m dmlbench.pipeline`` (``make repro``) runs the DVC pipeline, here in a pool
of workers or as one Slurm job per stage; its modules: docs/development.md. Launching worker
processes, which the tune stage shares with the executors, lives below both in :mod:`dmlbench.launch`.
"""
