"""Errors a user can fix. Stages print them as one line and exit with status 2."""

from __future__ import annotations


class DmlbenchError(Exception):
    """A problem with the user's input or environment, explained in one line."""


class ConfigError(DmlbenchError):
    """``params.yaml`` (or a stage argument) is invalid: names the key and what is allowed."""


class WeightsError(DmlbenchError):
    """Pretrained weights are missing, unreachable or do not match their pinned checksum."""


class DataError(DmlbenchError):
    """A dataset archive or image is missing, corrupt, or has the wrong checksum."""


class TrainingDiverged(DmlbenchError):
    """A training went non-finite: ``cause`` names what (``loss``, ``embeddings``, ``weights`` or
    ``validation embeddings``), ``epoch`` and ``batch`` when (None where not known, e.g. a study
    none of whose trials completed). The MLflow run's ``diverged`` tag is the cause."""

    def __init__(self, message: str, cause: str = "loss", epoch: int | None = None, batch: int | None = None):
        super().__init__(message)
        self.cause, self.epoch, self.batch = cause, epoch, batch


class NonFiniteEmbeddings(DataError):
    """Embeddings to evaluate hold NaN or infinity (a diverged model): names the run and the split."""
