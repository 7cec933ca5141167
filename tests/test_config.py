"""Settings: YAML, env overrides, profiles, and start-up refusing bad settings with one clear line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from proxy import settings_doc
from proxy.config import ConfigError, Settings, load_settings
from tests.harness import ROOT


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args], cwd=ROOT, env={**os.environ, **(env or {})},
        capture_output=True, text=True, timeout=60,
    )


@pytest.mark.parametrize(
    "env, yaml_text, named",
    [
        ({"CONTEXT_PROXY_SERVER__PORT": "eighty"}, None, "server.port"),
        ({}, "server:\n  prot: 80\n", "server.prot"),
        ({}, "storage:\n  backend: floppy\n", "storage.backend"),
        ({}, "surprise: true\n", "surprise"),
        ({"CONTEXT_PROXY_UPSTREAM__TIMEOUT_S": "-1"}, None, "upstream.timeout_s"),
    ],
)
def test_a_bad_setting_stops_startup_with_one_line_naming_it(tmp_path, env, yaml_text, named):
    config = tmp_path / "config.yaml"
    config.write_text(yaml_text or "{}\n")
    result = run_cli("serve", "--config", str(config), env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], result.stderr


def test_env_overrides_the_yaml(tmp_path, monkeypatch):
    config = tmp_path / "c.yaml"
    config.write_text("upstream:\n  base_url: http://from-yaml/v1\n  timeout_s: 5\n")
    monkeypatch.setenv("CONTEXT_PROXY_UPSTREAM__BASE_URL", "http://from-env/v1")
    settings = load_settings(config)
    assert settings.upstream.base_url == "http://from-env/v1"
    assert settings.upstream.timeout_s == 5


def test_shipped_config_is_the_documented_default():
    settings = load_settings(ROOT / "config.yaml")
    assert (settings.server.host, settings.server.port) == ("127.0.0.1", 8080)
    assert settings.upstream.base_url == "https://api.openai.com/v1"
    assert settings.storage.backend == "diskcache" and str(settings.storage.path) == "data"
    assert settings.admin.token is None


def test_legacy_env_var_sets_the_history_budget_below_our_own(tmp_path, monkeypatch):
    config = tmp_path / "c.yaml"
    config.write_text("context:\n  history_token_limit: 3000\n")
    assert load_settings(config).context.history_token_limit == 3000
    monkeypatch.setenv("DEFAULT_CONVERSATION_HISTORY_TOKEN_LIMIT", "4000")
    assert load_settings(config).context.history_token_limit == 4000
    monkeypatch.setenv("CONTEXT_PROXY_CONTEXT__HISTORY_TOKEN_LIMIT", "5000")
    assert load_settings(config).context.history_token_limit == 5000


def test_profiles_override_only_what_they_name():
    settings = load_settings(
        None,
        truncation={"max_tool_response_length": 8000},
        profiles={"small": {"context": {"history_token_limit": 500}}},
    )
    small = settings.profile("small")
    assert small.context.history_token_limit == 500
    assert small.truncation.max_tool_response_length == 8000  # inherited from the defaults
    assert settings.profile(None).context.history_token_limit == 10000
    assert settings.profile("missing") is None


@pytest.mark.parametrize(
    "overrides, named",
    [
        ({"profiles": {"p": {"context": {"history_token_limit": 1}}}}, "profiles.p.context.history_token_limit"),
        ({"profiles": {"p": {"truncation": {"nope": 1}}}}, "profiles.p.truncation.nope"),
        ({"models": {"m": {"profile": "ghost"}}}, "models.m.profile"),
        ({"truncation": {"preview_length": 20000}}, "preview_length must be smaller"),
    ],
)
def test_bad_profiles_are_refused_naming_the_setting(overrides, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_settings(None, **overrides)


def test_a_compactor_class_that_does_not_import_stops_start_up_naming_the_setting():
    from proxy.app import build_app

    settings = load_settings(None, compaction={"strategy": "turns", "compactor_class": "nowhere.Compactor"})
    with pytest.raises(ConfigError, match=r"compaction\.compactor_class: cannot import"):
        build_app(settings)


def test_the_readme_lists_every_setting_as_the_models_describe_it():
    """The README's settings table is `context-proxy settings`: one place describes a setting."""
    readme = (ROOT / "README.md").read_text()
    table = readme.split(settings_doc.START, 1)[1].split(settings_doc.END, 1)[0].strip()
    assert table == settings_doc.reference()
    for section, field in Settings.model_fields.items():
        if section not in ("profiles", "models"):
            assert all(f"`{section}.{key}`" in table for key in field.annotation.model_fields)
    done = subprocess.run([sys.executable, "-m", "proxy", "settings"], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == table
