"""The engine: actors, refs, resources, scheduling. Reaches algorithms only via algorithms.REGISTRY."""
