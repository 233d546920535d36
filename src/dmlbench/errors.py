"""Errors a user can fix. Stages print them as one line and exit with status 2."""


class DmlbenchError(Exception):
    """A problem with the user's input or environment, explained in one line."""


class ConfigError(DmlbenchError):
    """``params.yaml`` (or a stage argument) is invalid: names the key and what is allowed."""


class DataError(DmlbenchError):
    """A dataset archive or image is missing, corrupt, or has the wrong checksum."""


class TrainingDiverged(DmlbenchError):
    """The training loss became NaN or infinite."""
