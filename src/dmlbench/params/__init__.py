"""The params schema in one folder: the validated :class:`~.model.Params`, its sections, one run's
resolved config and presets. Registries (``data``, ``losses``, ``models``) never import it.
"""
