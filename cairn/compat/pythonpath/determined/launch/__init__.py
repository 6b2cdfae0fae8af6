"""Determined's launchers, each an entry point onto cairn's (``cairn.launch``):
``python3 -m determined.launch.torch_distributed``, ``.horovod``, ``.deepspeed`` and
``.wrap_rank``."""
