"""The report's sections in reading order. Adding a section = one module with a ``SECTION``
(:class:`~dmlbench.analysis.sections.base.Section`) + one line here."""

from dmlbench.analysis.sections import (
    convergence,
    cost,
    embedding_size,
    feedback,
    frozen_vs_trained,
    limitations,
    papers,
    results,
    retrieval,
    setup,
    statistical_tests,
    summary,
    tournament,
    tuning,
)

SECTIONS = (
    summary.SECTION,
    setup.SECTION,
    tuning.SECTION,
    results.SECTION,
    tournament.SECTION,
    statistical_tests.SECTION,
    papers.SECTION,
    frozen_vs_trained.SECTION,
    embedding_size.SECTION,
    convergence.SECTION,
    feedback.SECTION,
    cost.SECTION,
    retrieval.SECTION,
    limitations.SECTION,
)
