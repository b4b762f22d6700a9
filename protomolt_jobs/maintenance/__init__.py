"""Background upkeep of the store: the lease sweeper (``sweeper``) and the pruner (``pruner``)."""
