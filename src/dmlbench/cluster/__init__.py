"""Running the pipeline on a Slurm cluster: the ``cluster:`` settings, one job per stale DVC stage
submitted with Slurm's own dependencies, and the job wrapper that forwards Slurm's warning
signal and requeues (``python -m dmlbench.pipeline --executor slurm``)."""
