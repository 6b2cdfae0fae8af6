"""Slurm resource pools: each allocation asked of such a pool becomes a Slurm batch job whose
agents, reserved for it, run it (``docs/slurm.md``).

:mod:`.requests` finds what the log asks of the pools, :mod:`.decide` decides (a pure function
of the folded log and one ``squeue`` snapshot), :mod:`.script` writes the batch script,
:mod:`.commands` runs ``sbatch``/``squeue``/``scancel``, and :mod:`.bridge` is the scheduler's
consumer that records the decisions and carries out their effects.
"""
