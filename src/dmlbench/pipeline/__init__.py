"""The runner: ``python -m dmlbench.pipeline`` (``make repro``) runs the DVC pipeline.

``plan`` (the stale stages and what follows them, from DVC's graph), ``local`` (a pool of
workers here, one stage each; ``guard``: one copy of a stage at a time, and a note that its command
completed), ``record`` and ``lockfile`` (DVC's bookkeeping, dvc.lock written in batches), ``slurm``
(one Slurm job per stage; ``slurm_submission``, ``slurm_state``, ``slurm_endings``,
``slurm_queries``, ``slurm_command``, ``checkpoints``: submitting, taking over after a restart,
every ending) with its job wrapper ``job``,
``preflight`` (weights and dataset archives checked before any stage), ``workspace`` and
``presets`` (a preset in a git worktree of its own), ``summary`` (what a run ends with) and the
command line in ``__main__``. Launching worker processes (a local pool or a Slurm array), which
the tune stage shares with the executors, lives below both in :mod:`dmlbench.launch`.
"""
