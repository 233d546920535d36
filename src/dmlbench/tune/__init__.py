"""Hyperparameter tuning: every loss searched the same way (the Reality Check's protocol) with Optuna.

``settings`` (the ``tuning:`` section), ``space`` (Optuna suggestions from the loss modules'
search spaces), ``samplers`` and ``study`` (storage, resume), ``objective`` (one trial = one
training per fold, validation classes only), ``results`` (the best configuration file that
``train@`` reads) and ``stage`` (``tune@<dataset>-<backbone>-<loss>``).
"""
