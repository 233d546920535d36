"""The params schema in one folder: reading (``files``), the validated :class:`~.model.Params`
(``model``) and its loader (``load``), the protocol and settings sections (``protocol``,
``sections``), the tuning and cluster sections (``tuning``, ``cluster``; checked by the stages
that read them and all together by ``complete``), one run's resolved config (``run``), the tune
stage's result files (``tuned``), a dataset's section alone (``datasets``) and presets
(``presets``). Registries (``data``, ``losses``, ``models``) never import it.
"""
