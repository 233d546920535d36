"""The loss classes that dmlbench defines itself, one per file, each named like its registry member
(``_impl/thesis_proxy.py`` is the class of ``losses/thesis_proxy.py``).

They import torch and pytorch-metric-learning at their top; the member imports its class here
inside its ``build()`` only, so validating ``params.yaml`` (which every stage does first, through
the registry) imports neither. The equations and sources are in the member's docstring.
"""
