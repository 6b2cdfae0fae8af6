"""``python -m services.tracker``: a placeholder tracker; its issue has not landed yet.

It connects to the log and the bus, announces readiness and idles until SIGTERM/SIGINT, so that
``cairn up`` can run the whole cluster today. The real tracker replaces this file.
"""

from __future__ import annotations

from services.runtime import ServiceContext, main


async def run(ctx: ServiceContext) -> None:
    """Announces readiness, then idles until stopped."""
    ctx.ready()
    await ctx.stop.wait()


if __name__ == "__main__":
    main("tracker", run)
