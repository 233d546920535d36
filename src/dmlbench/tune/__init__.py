"""Hyperparameter tuning: every loss searched the same way (the Reality Check's protocol) with Optuna."""
