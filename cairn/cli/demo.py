"""``cairn demo``: start the embedded cluster and run a real adaptive ASHA search on it."""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from cairn.client import Client
from cairn.errors import CairnError
from cairn.local import service_credentials
from cairn.local.layout import DEFAULT_DIR_NAME, default_data_dir
from cairn.local.state import read_state
from events import settings
from events.domain import lifecycle

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "digits"
BASELINE_ACCURACY = 0.9


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds ``cairn demo``."""
    p = subparsers.add_parser("demo", help="start the embedded cluster and run an ASHA search")
    p.add_argument(
        "--data-dir", type=Path, default=None, help="cluster data dir (default ./.cairn)"
    )
    p.add_argument("--slots", type=int, default=2, help="CPU slots of the local agent")
    p.add_argument("--api-port", type=int, default=8080, help="API port (0: any free port)")
    p.add_argument("--config", type=Path, default=EXAMPLE / "adaptive.yaml")
    p.add_argument("--code", type=Path, default=EXAMPLE)
    p.add_argument("--stop", action="store_true", help="stop the cluster when the search is done")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for the search")
    p.set_defaults(handler=run)


def _cli(*argv: str) -> int:
    from cairn.cli import main

    return main(list(argv))


def run(args: argparse.Namespace) -> int:
    """Starts the cluster, submits the search, follows it, and reports the best trial."""
    data_dir = (args.data_dir or default_data_dir()).resolve()
    print(f"==> starting the embedded cluster in {data_dir}")
    code = _cli(
        "up", "--data-dir", str(data_dir), "--slots", str(args.slots),
        "--api-port", str(args.api_port),
    )  # fmt: skip
    if code != 0:
        return code
    state = read_state(data_dir)
    if state is None or not state.api_url:
        raise CairnError("the cluster did not record its API address")
    client = Client(state.api_url)
    password = service_credentials.admin_password(data_dir) or settings.ADMIN_PASSWORD.get()
    if password is None:
        raise CairnError(f"no admin password in {data_dir}; run `cairn up` there first")
    client.login("admin", password)
    print(f"==> submitting {args.config} (code: {args.code})")
    exp_id = client.create_experiment(args.config.read_text(), args.code)
    print(f"==> experiment {exp_id} submitted; following it")
    print(_web_ui(state.api_url, exp_id, data_dir))
    summary = _follow(client, exp_id, args.timeout)
    ok = _report(client, summary)
    print()
    print(_web_ui(state.api_url, exp_id, data_dir))
    print(f"API:        {state.api_url}/api/v1/openapi.json (log in: POST /api/v1/auth/login)")
    print(f"Events:     {state.api_url}/api/v1/events/stream?experiment_id={exp_id} (SSE)")
    cli = cairn_command()
    print(
        f"Try:        {cli} experiment describe {exp_id}; {cli} experiment list-trials {exp_id}; "
        f"{cli} experiment list-checkpoints {exp_id}; {cli} agent list"
    )
    if cli != "cairn":
        print(f"            (or put cairn on your PATH: export PATH={Path(cli).parent}:$PATH)")
    print(f"Data dir:   {data_dir} (logs in {data_dir / 'logs'})")
    # ``cairn up`` notes a cluster in the default place, so the CLI finds it from anywhere.
    where = "" if data_dir.name == DEFAULT_DIR_NAME else f" --data-dir {data_dir}"
    if args.stop:
        _cli("down", "--data-dir", str(data_dir))
    else:
        print(
            f"The cluster is still running: `{cli} status{where}`; stop it with "
            f"`{cli} down{where}`."
        )
    return 0 if ok else 1


def cairn_command() -> str:
    """How to run this CLI from a shell: ``cairn`` when that name on the PATH is this very
    program, else the full path of the ``cairn`` script beside this Python."""
    script = Path(sys.executable).parent / "cairn"
    found = shutil.which("cairn")
    if found is not None and script.exists() and Path(found).resolve() == script.resolve():
        return "cairn"
    return str(script) if script.exists() else f"{sys.executable} -m cairn"


def _web_ui(api_url: str, exp_id: int, data_dir: Path) -> str:
    """The lines telling where the web UI is and how to log in."""
    where = data_dir / service_credentials.ADMIN_PASSWORD_FILE
    return (
        f"Web UI:     {api_url}/#/experiments/{exp_id}  (log in as admin, password in {where})\n"
        f"            compare the best trials from the Trials tab; the cluster at {api_url}/#/cluster"
    )


def _follow(client: Client, exp_id: int, timeout: float) -> dict[str, Any]:
    """Polls the experiment through the API and draws a progress bar until it ends."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        summary = client.call("GET", f"/experiments/{exp_id}")
        _draw(summary)
        if summary["state"] in lifecycle.TERMINAL:
            print()
            return dict(summary)
        time.sleep(1.0)
    raise CairnError(f"experiment {exp_id} did not finish in {timeout:.0f}s")


def _draw(summary: dict[str, Any]) -> None:
    trials = summary.get("trials") or []
    done = sum(1 for t in trials if t.get("state") in lifecycle.TERMINAL)
    total = max(int(summary.get("max_trials") or 0), len(trials), 1)
    best = summary.get("best_metric")
    metric = summary.get("searcher_metric") or "metric"
    shown = f" best {metric} {best:.4f}" if isinstance(best, int | float) else ""
    width = 30
    filled = int(width * done / total)
    line = (
        f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} trials closed, "
        f"{len(trials) - done} live{shown}  {summary['state']:<20}"
    )
    sys.stdout.write(line)
    sys.stdout.flush()


def _best_validation(client: Client, summary: dict[str, Any]) -> dict[str, Any] | None:
    """The best trial's validation row at its best searcher metric."""
    trial_id = summary.get("best_trial_id")
    metric = summary.get("searcher_metric") or "validation_loss"
    if trial_id is None:
        return None
    rows = client.call("GET", f"/trials/{trial_id}/metrics?group=validation")["metrics"]
    scored = [r for r in rows if isinstance(r["metrics"].get(metric), int | float)]
    if not scored:
        return None
    sign = 1.0 if summary.get("smaller_is_better", True) else -1.0
    return dict(min(scored, key=lambda r: sign * float(r["metrics"][metric])))


def _report(client: Client, summary: dict[str, Any]) -> bool:
    trials = {t["trial_id"]: t for t in summary.get("trials") or []}
    print(f"experiment {summary['id']}: {summary['state']}, {len(trials)} trials")
    row = _best_validation(client, summary)
    if row is None:
        print("no trial reported a validation metric")
        return False
    trial_id = summary["best_trial_id"]
    metrics = row["metrics"]
    acc = float(metrics.get("validation_accuracy", 0.0))
    print(
        f"best trial {trial_id}: validation_loss {metrics.get('validation_loss', float('nan')):.4f}, "
        f"validation_accuracy {acc:.4f} at {row['steps_completed']} batches"
    )
    hparams = trials.get(trial_id, {}).get("hparams", {})
    print(
        "hyperparameters: "
        + ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in sorted(hparams.items())
        )
    )
    verdict = "beats" if acc > BASELINE_ACCURACY else "does NOT beat"
    print(f"{verdict} the {BASELINE_ACCURACY:.2f} accuracy baseline")
    return summary["state"] == "COMPLETED" and acc > BASELINE_ACCURACY
