"""MLflow tracking: one store, experiments created once, one run per training."""

from dmlbench.tracking.runs import TrackedRun, start_training_run
from dmlbench.tracking.store import configure_environment, ensure_experiment, tracking_uri

__all__ = ["TrackedRun", "configure_environment", "ensure_experiment", "start_training_run", "tracking_uri"]
