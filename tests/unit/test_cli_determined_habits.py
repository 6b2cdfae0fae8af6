"""A Determined user's CLI habits: ``det``'s abbreviations and arguments parse to cairn's verbs,
a verb group alone runs its default verb, ``DET_MASTER``/``DET_USER``/``DET_PASS`` are read
next to the ``CAIRN_*`` variables (which win), ``--version`` and shell completion work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cairn import auth
from cairn.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("command", "handler", "checks"),
    [
        ("e create c.yaml . -f", "cmd_create", {"follow": True}),
        ("e create c.yaml --follow-first-trial -i x.py", "cmd_create", {"model_dir": None}),
        ("experiment list --all --csv", "cmd_list", {"all": True, "csv": True}),
        ("e ls -a --pages 1", "cmd_list", {"pages": "1"}),
        ("e describe 3,4 --json", "cmd_describe", {"ids": [3, 4]}),
        ("e lt 3 --limit 5 --offset 1", "cmd_list_trials", {"limit": 5}),
        ("e lc 3 --best 2", "cmd_list_checkpoints", {"best": 2}),
        ("e activate 3", "cmd_action", {"action": "activate"}),
        ("e unpause 3", "cmd_action", {"action": "activate"}),
        ("e continue 3 --config max_restarts=2 -f", "cmd_continue", {"follow": True}),
        ("e download 3 --top-n 2 --sort-by acc --smaller-is-better false -q", "cmd_download", {}),
        ("e wait 3 --polling-interval 5", "cmd_wait", {}),
        ("e logs 3 -f --head 5", "cmd_logs", {"head": 5}),
        ("t logs 7 -f --tail 10 --rank-id 1 --level WARN", "cmd_logs", {"rank_ids": [1]}),
        ("trial describe 7 --metrics --csv", "cmd_describe", {"metrics": True}),
        ("t download 7 --best -o out -q", "cmd_download", {"quiet": True}),
        ("t kill 7", "cmd_kill", {}),
        ("c download 0123 -o out --mode master -q", "cmd_download", {"mode": "master"}),
        ("checkpoint delete a,b --yes", "cmd_delete", {"uuids": ["a,b"]}),
        ("a list --csv", "cmd_agent_list", {}),
        ("agent disable --all --drain", "cmd_agent_enable", {"all": True, "drain": True}),
        ("s ls", "cmd_slot_list", {}),
        ("slot disable agent-1 0", "cmd_slot_enable", {"enabled": False}),
        ("u ls", "cmd_list", {}),
        ("user login alice", "cmd_login", {"username": "alice"}),
        ("u logout --all", "cmd_logout", {}),
        ("user change-password bob", "cmd_change_password", {"username": "bob"}),
        ("tpl create t t.yaml", "cmd_set", {"must_be": "new"}),
        ("template set-value config t t.yaml", "cmd_set", {"must_be": "existing"}),
        ("template rm t", "cmd_remove", {}),
        ("-u alice -m host:8080 e list", "cmd_list", {"as_user": "alice", "master": "host:8080"}),
        ("-u alice audit --user bob", "cmd_audit", {"as_user": "alice", "user": "bob"}),
    ],
)
def test_det_command_lines_parse_to_cairns_verbs(
    command: str, handler: str, checks: dict[str, object]
) -> None:
    """Each ``det`` command line (``det`` replaced by ``cairn``) reaches the right verb with its
    arguments."""
    args = build_parser().parse_args(command.split())
    assert args.handler.__name__ == handler
    for name, value in checks.items():
        assert getattr(args, name) == value, name


def test_a_verb_group_alone_runs_its_default_verb() -> None:
    """``det e``, ``det u``, ``det a``, ``det s`` and ``det tpl`` list, as Determined's do;
    ``det t`` (no default) prints its help."""
    parser = build_parser()
    for group in ("e", "experiment", "u", "a", "s", "tpl"):
        assert parser.parse_args([group]).default_verb == "list", group
    assert getattr(parser.parse_args(["t"]), "default_verb", None) is None


def test_version_flag_prints_the_cli_version(capsys: pytest.CaptureFixture[str]) -> None:
    """``cairn --version`` and ``-v`` print the version and exit 0."""
    for flag in ("--version", "-v"):
        with pytest.raises(SystemExit) as stop:
            main([flag])
        assert stop.value.code == 0
        assert capsys.readouterr().out.startswith("cairn ")


def test_the_master_comes_from_cairn_then_determined_variables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``-m`` wins, then CAIRN_MASTER, DET_MASTER, DET_MASTER_ADDR; a bare host gets http://
    and Determined's port 8080."""
    monkeypatch.setenv("CAIRN_HOME", str(tmp_path))
    for name in auth.MASTER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert auth.resolve_master(None) == "http://localhost:8080"
    monkeypatch.setenv("DET_MASTER_ADDR", "addr.example")
    assert auth.resolve_master(None) == "http://addr.example:8080"
    monkeypatch.setenv("DET_MASTER", "det.example:9090")
    assert auth.resolve_master(None) == "http://det.example:9090"
    monkeypatch.setenv("CAIRN_MASTER", "https://cairn.example/")
    assert auth.resolve_master(None) == "https://cairn.example"
    assert auth.resolve_master("given.example") == "http://given.example:8080"


def test_credentials_come_from_cairn_then_determined_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CAIRN_USER/CAIRN_PASSWORD win over DET_USER/DET_PASS; an explicit user's password is
    the one its variables pair it with."""
    for user_var, password_var in auth.CREDENTIAL_VARIABLES:
        monkeypatch.delenv(user_var, raising=False)
        monkeypatch.delenv(password_var, raising=False)
    assert auth.env_credentials() is None
    monkeypatch.setenv("DET_USER", "det-user")
    monkeypatch.setenv("DET_PASS", "det-pass")
    assert auth.env_credentials() == ("det-user", "det-pass")
    monkeypatch.setenv("CAIRN_USER", "cairn-user")
    monkeypatch.setenv("CAIRN_PASSWORD", "cairn-pass")
    assert auth.env_credentials() == ("cairn-user", "cairn-pass")
    assert auth.env_password("det-user") == "det-pass"
    assert auth.env_password("cairn-user") == "cairn-pass"
    assert auth.env_password("someone-else") is None


def test_shell_completion_for_bash_and_zsh(tmp_path: Path) -> None:
    """``cairn completion bash|zsh`` prints the shell's code, and the CLI completes verbs and
    their Determined aliases through it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    env["PYTHONPATH"] = str(ROOT)
    for shell, marker in (("bash", "complete "), ("zsh", "#compdef cairn")):
        done = subprocess.run(
            [sys.executable, "-m", "cairn.cli", "completion", shell],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0 and marker in done.stdout, done.stderr
    answer = tmp_path / "completions"
    line = "cairn experiment lis"
    env.update(
        _ARGCOMPLETE="1",
        _ARGCOMPLETE_IFS="\n",
        COMP_LINE=line,
        COMP_POINT=str(len(line)),
        _ARGCOMPLETE_STDOUT_FILENAME=str(answer),
    )
    subprocess.run(
        [sys.executable, "-m", "cairn.cli"], env=env, capture_output=True, timeout=60, check=False
    )
    assert "list" in answer.read_text().split()
