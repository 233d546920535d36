"""What a grid costs before it runs (``make plan``) and when a running one ends (the runner's ETA).

``model`` (pure maths: a stage's work -> seconds, a schedule's wall time, the ETA corrected by
the stages already done), ``rates`` (the training throughput table ``make gpu-check`` writes to
``reports/gpu_check.json``, and FLOP counts where a protocol/backbone was not measured),
``stages`` (the stages exactly as DVC expands ``dvc.yaml`` over the grid's params), ``price``
(every stage's estimate from the params) and ``render`` (the plan's text).
"""
