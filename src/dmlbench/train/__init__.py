"""Training: the shared loop, optimisers, resumable checkpoints and the train stage."""

from dmlbench.train.loop import TrainOutcome, train

__all__ = ["TrainOutcome", "train"]
