"""Launchers: an entrypoint such as ``python3 -m cairn.launch.torch_distributed python3 train.py``
runs once per agent of a trial's gang and starts that agent's ranks (``torchrun``, Horovod).

The agent gives each launcher its part of the gang in the environment: ``LOCAL_WORLD_SIZE``
(slots here), ``WORLD_SIZE``, ``CAIRN_NODE_RANK``, ``CAIRN_NUM_NODES``, ``CAIRN_RANK_OFFSET``
(global rank of this agent's first rank) and the chief's ``MASTER_ADDR``/``MASTER_PORT`` agreed
in the rendezvous. Determined's module names (``determined.launch.torch_distributed``) in a
config's entrypoint start these launchers.
"""
