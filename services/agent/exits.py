"""Exit reports: each is kept on disk (:mod:`services.agent.outbox`) before it is sent, and
sent until the API answers, by a later incarnation of the agent if need be.
"""

from __future__ import annotations

import asyncio

import structlog

from events.log import faults
from services.agent.client import ApiError
from services.agent.outbox import ExitReport
from services.agent.state import AgentState

log = structlog.get_logger("agent")


class ExitReporting(AgentState):
    """Keeps and sends the exit reports of the agent's runs."""

    async def _report_exit(
        self, allocation_id: str, exit_code: int, message: str, *, agent_shutdown: bool = False
    ) -> None:
        """Reports a run's exit, kept on disk until the API answers (see ``_announce``)."""
        report = await self._keep_exit(
            allocation_id, exit_code, message, agent_shutdown=agent_shutdown
        )
        await self._send_exit(report)

    async def _keep_exit(
        self, allocation_id: str, exit_code: int, message: str, *, agent_shutdown: bool = False
    ) -> ExitReport:
        report = ExitReport(
            allocation_id,
            exit_code,
            message,
            f"exited:{allocation_id}:{self.id}",
            agent_shutdown=agent_shutdown,
        )
        await asyncio.to_thread(self.unreported.keep, report)
        return report

    async def _send_exit(self, report: ExitReport) -> None:
        await faults.point("agent.before_exit_report")
        aid = report.allocation_id
        try:
            await self.client.exited(
                aid,
                self.id,
                report.exit_code,
                report.message,
                report.key,
                agent_shutdown=report.agent_shutdown,
            )
        except ApiError as exc:  # refused for good (retryable failures are retried forever)
            log.error("exit report refused", allocation_id=aid, error=str(exc))
        else:
            log.info("exit reported", allocation_id=aid, exit_code=report.exit_code)
        self.unreported.done(aid)
        self.run_processes.done(aid)
