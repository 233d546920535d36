"""MLflow tracking, every write in one place: the store and experiments (``store``), runs and their
lifecycle (``runs``, ``record``), grid cells (``cells``), studies (``studies``), run logs
(``runlog``), the report's run and the UI."""
