"""Evaluation: exact retrieval metrics (Reality Check definitions), kNN, clustering, intervals, embedding.

No names are gathered here: importing one module of the package must not make a stage depend on
the others (training validates with the ranking metrics but never clusters)."""
