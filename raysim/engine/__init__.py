"""The engine: actors, refs, resources, scheduling. It reaches algorithms only by name and through
their contract (``raysim.algorithms.base``): ``raysim.setup.make_algorithm`` resolves the
scenario's ``algorithm.name`` with ``raysim.plugins.algorithm``, which looks in
``raysim.algorithms.REGISTRY`` first, then at a ``module:Name`` or an installed plugin's entry
point (the same resolution in the driver and in every host)."""
