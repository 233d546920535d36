"""Results indexes (``reports/results.csv``) of several labs: merge them (:mod:`.merge`) and report
on the merge (:mod:`.report`); ``python -m dmlbench.results`` (:mod:`.__main__`)."""
