"""The engine: actors, refs, resources, scheduling. It reaches algorithms only by name and through
their contract (``raysim.algorithms.base``): ``raysim.scenario.build.make_algorithm`` resolves the
scenario's ``algorithm.name`` with ``raysim.algorithms.resolve``, which looks in
``raysim.algorithms.REGISTRY`` first, then at a ``module:Name`` or an installed plugin's entry
point (the same resolution in the driver and in every host).

- ``driver`` (the rounds) with ``placement`` (the Transport, where each client lives),
  ``sampling`` (who takes part), ``metrics`` (the clients' numbers reduced) and ``fleet_rounds``
  (the simulated fleet's clock); ``drivers`` (which driver a scenario gets), ``asynchronous``
  (FedBuff, FedAsync on the virtual clock), ``gossip`` (decentralized rounds);
- ``host`` (a host's clients: shards, state, the loop), ``host_process`` (its device and
  memory), ``trees`` (state as tensors);
- ``serial`` and ``ray_engine`` (the two transports; every Ray call lives in ``ray_*``:
  ``ray_hosts``, ``ray_start`` with ``ray_local`` and ``ray_join``, ``ray_agent``,
  ``ray_zygote``, ``ray_sweep``);
- ``checkpoint`` (exact resume), ``faults`` (the test suite's fault injection).

May import ``raysim.scenario`` and the wings below it; never ``raysim.results`` (a run's
tracker is handed in) nor ``raysim.experiment``."""
