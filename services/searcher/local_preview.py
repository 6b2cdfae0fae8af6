"""A custom searcher's class run on this machine for ``preview-search``.

The preview itself (:mod:`events.domain.search.preview`) is pure; this module is what runs the
user's class for it: the user's own code, for the user, in :meth:`Sandbox.local` (no confinement,
no cluster). It is the one module of the searcher service the CLI imports.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from events.domain.search import Operation, SearchMethod
from events.domain.search.custom import CustomStrategy, hook_of
from services.searcher.sandbox import Sandbox, SandboxError, SandboxSettings, as_json


class LocalAnswers:
    """Answers a custom search's due calls at once, from the user's class run on this machine
    (the user's own code, for the user: no sandbox).

    Args:
        strategy: the custom search whose calls are answered.
        code_dir: the directory holding the user's searcher module.
    """

    def __init__(self, strategy: CustomStrategy, code_dir: Path) -> None:
        self.strategy = strategy
        self.code_dir = code_dir
        self.settings = SandboxSettings.from_env()
        self.loop = asyncio.new_event_loop()
        self.process: Sandbox | None = None

    def _ask(self, message: dict[str, Any], timeout: float) -> list[dict[str, Any]]:
        if self.process is None:
            self.process = self.loop.run_until_complete(
                Sandbox.local(self.code_dir, settings=self.settings)
            )
            startup = max(self.settings.call_timeout, self.settings.startup_timeout)
            init = self.process.ask(self.strategy.init_message(), hook="__init__", timeout=startup)
            self.loop.run_until_complete(init)
        ops = self.process.ask(message, hook=hook_of(message), timeout=timeout)
        return as_json(self.loop.run_until_complete(ops))

    def answer(self, method: SearchMethod) -> list[Operation]:
        """Asks every due call in order and returns what the method decided from the answers."""
        out: list[Operation] = []
        strategy = self.strategy
        while strategy.answers_due:
            call = strategy.answered + 1
            try:
                ops = self._ask(strategy.calls[call - 1], self.settings.call_timeout)
            except SandboxError as exc:
                method.on_call_failed(call, f"custom searcher {strategy.searcher_class}: {exc}")
                break
            out.extend(method.on_answer(call, ops))
        return out

    def close(self) -> None:
        """Ends the process."""
        if self.process is not None:
            self.loop.run_until_complete(self.process.close())
        self.loop.close()
