"""``python -m tests.browser.screenshot``: the README's picture of the web UI.

Runs ``cairn demo`` (its ASHA search over the digits example, shortened to 8 trials so the
picture takes minutes, not an hour) on a scratch cluster, opens the experiment page in Debian's
headless Chromium, saves a screenshot of its top (overview and learning curves) as a PNG, and
stops the cluster. ``make screenshot`` runs it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from cairn.local.service_credentials import admin_password
from cairn.local.state import read_state
from tests.browser.support import CHROMIUM, CHROMIUM_ARGS, Http

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    """Runs the demo, takes the screenshot, stops the cluster."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "webui-experiment.png")
    parser.add_argument("--trials", type=int, default=8)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="cairn-shot-"))
    scratch.chmod(0o755)  # the unprivileged PostgreSQL user must reach its data directory
    config = yaml.safe_load((ROOT / "examples" / "digits" / "adaptive.yaml").read_text())
    config["searcher"].update(max_trials=args.trials, max_time=400, max_concurrent_trials=2)
    small = scratch / "asha.yaml"
    small.write_text(yaml.safe_dump(config))
    data = scratch / "cluster"
    env = {k: v for k, v in os.environ.items() if k not in ("CAIRN_HOME", "CAIRN_MASTER")}
    env["PYTHONPATH"] = str(ROOT)
    cairn = [sys.executable, "-m", "cairn"]
    try:
        demo = [*cairn, "demo", "--data-dir", str(data), "--config", str(small), "--api-port", "0"]
        subprocess.run(demo, cwd=ROOT, env=env, check=False, timeout=3600)
        state = read_state(data)
        if state is None or not state.api_url:
            print("the demo cluster did not start", file=sys.stderr)
            return 1
        _shoot(state.api_url, admin_password(data) or "", args.out)
        print(f"wrote {args.out} ({args.out.stat().st_size // 1024} KiB)")
        return 0
    finally:
        subprocess.run([*cairn, "down", "--data-dir", str(data)], cwd=ROOT, env=env, check=False)
        shutil.rmtree(scratch, ignore_errors=True)


def _shoot(api_url: str, password: str, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    api = Http(api_url)
    token = api.login("admin", password)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.goto(f"{api_url}/#/login")
        page.evaluate(
            "([t]) => { localStorage.setItem('cairn.token', t);"
            " localStorage.setItem('cairn.user', JSON.stringify({username: 'admin', admin: true})); }",
            [token],
        )
        page.goto(f"{api_url}/#/experiments/1")
        page.wait_for_selector("#learning-curves canvas")
        page.wait_for_function(
            "() => Number(document.querySelector('#learning-curves').dataset.series) > 0"
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out))
        browser.close()


if __name__ == "__main__":
    sys.exit(main())
