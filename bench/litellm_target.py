"""LiteLLM's proxy as a comparison target, in its own venv, in front of the same mock upstream.

The venv (`bench/.litellm-venv`, gitignored) is made on first use with the python that runs the
bench: `python -m venv bench/.litellm-venv && bench/.litellm-venv/bin/pip install 'litellm[proxy]'`.
Its config maps every model name the bench sends to `openai/<name>` at the mock's base URL. The
cost map is the local copy (LITELLM_LOCAL_MODEL_COST_MAP), telemetry is off, there is no database,
one uvicorn worker, and logs at ERROR: nothing leaves the machine and nothing is logged per request.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .procs import Proc

VENV = Path(__file__).resolve().parent / ".litellm-venv"
ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_TELEMETRY": "False",
    "LITELLM_LOG": "ERROR",
    "LITELLM_MODE": "PRODUCTION",  # do not read a .env file
    "DISABLE_ADMIN_UI": "True",
    "TOKENIZERS_PARALLELISM": "false",
}


def ensure_installed(log: Path) -> tuple[Path | None, str]:
    """(path of the litellm executable, how it went); None when it could not be installed."""
    exe = VENV / "bin" / "litellm"
    if exe.exists():
        return exe, "already installed"
    log.parent.mkdir(parents=True, exist_ok=True)
    steps = [
        [sys.executable, "-m", "venv", str(VENV)],
        [str(VENV / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "litellm[proxy]"],
    ]
    with open(log, "wb") as out:
        for step in steps:
            try:
                done = subprocess.run(step, stdout=out, stderr=subprocess.STDOUT, timeout=900, check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                return None, f"install failed: {exc}"
            if done.returncode != 0:
                return None, f"install failed ({' '.join(step[-2:])} exited {done.returncode}); see {log}"
    return (exe, "installed") if exe.exists() else (None, f"install produced no litellm executable; see {log}")


def version() -> str | None:
    try:
        out = subprocess.run(
            [str(VENV / "bin" / "python"), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
            capture_output=True, text=True, timeout=60, check=False,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def write_config(path: Path, mock_base_url: str, models: list[str], master_key: str) -> None:
    lines = ["model_list:"]
    for name in models:
        lines += [
            f"  - model_name: {name}",
            "    litellm_params:",
            f"      model: openai/{name}",
            f"      api_base: {mock_base_url}",
            "      api_key: sk-bench-upstream",
        ]
    lines += [
        "litellm_settings:",
        "  telemetry: false",
        "  drop_params: true",
        "  set_verbose: false",
        "  request_timeout: 300",
        "general_settings:",
        f"  master_key: {master_key}",  # it refuses to start without one; clients send it as their key
        "  disable_spend_logs: true",
        "  disable_reset_budget: true",
    ]
    path.write_text("\n".join(lines) + "\n")


def make_proc(exe: Path, config: Path, port: int, log: Path, cpus: set[int] | None) -> Proc:
    return Proc(
        name="litellm",
        argv=[
            str(exe), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
            "--num_workers", "1", "--telemetry", "False", "--keepalive_timeout", "75",
        ],
        port=port,
        ready_path="/health/liveliness",
        log=log,
        env=ENV,
        cwd=str(config.parent),
        cpus=cpus,
    )
