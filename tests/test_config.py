"""Settings: YAML, env overrides, profiles, and start-up refusing bad settings with one clear line."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from proxy import settings_doc
from proxy.config import ConfigError, Settings, load_settings
from tests.support.harness import ROOT


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
        ({}, "server: {port: 1\n", "cannot read"),  # malformed YAML: still one line
        ({}, "- server\n", "must hold a mapping"),
        ({"CONTEXT_PROXY_UPSTREAM__TIMEOUT_S": "-1"}, None, "upstream.timeout_s"),
        # a key under its old flat name and its new one at once: the error names the new one
        ({"CONTEXT_PROXY_COMPACTION__MASK__BATCH": "2"}, "compaction:\n  mask_batch: 3\n", "set only mask.batch"),
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


# -- compaction: each strategy's own section; the old flat names --------------------------------------------------


def test_each_strategy_reads_its_own_section_from_the_yaml_and_the_env(tmp_path, monkeypatch):
    config = tmp_path / "c.yaml"
    config.write_text(
        "compaction:\n  strategy: mask\n  mask: {keep_tool_outputs: 3, batch: 2}\n"
        "  budget: {max_history_summary_length: 9000, compaction_percent: 30}\n"
    )
    monkeypatch.setenv("CONTEXT_PROXY_COMPACTION__MASK__BATCH", "5")  # the env wins over the YAML, key by key
    monkeypatch.setenv("CONTEXT_PROXY_COMPACTION__TURNS__EVERY_N_USER_MESSAGES", "4")
    settings = load_settings(config)
    compaction = settings.compaction
    assert (compaction.mask.keep_tool_outputs, compaction.mask.batch) == (3, 5)
    assert compaction.turns.every_n_user_messages == 4
    assert (compaction.budget.max_history_summary_length, compaction.budget.compaction_percent) == (9000, 30)
    assert compaction.budget.recent_context_messages == 6  # a default
    assert settings.moved_keys() == []


OLD_FLAT = {
    "keep_tool_outputs": 3, "mask_batch": 2, "every_n_user_messages": 4,
    "max_history_summary_length": 9000, "compaction_percent": 30, "recent_context_messages": 2,
}
NEW_NESTED = {
    "mask": {"keep_tool_outputs": 3, "batch": 2}, "turns": {"every_n_user_messages": 4},
    "budget": {"max_history_summary_length": 9000, "compaction_percent": 30, "recent_context_messages": 2},
}


def test_the_old_flat_names_set_the_same_settings_as_the_new_ones_and_are_listed_as_moved(tmp_path, monkeypatch):
    config = tmp_path / "c.yaml"
    config.write_text("compaction:\n  strategy: budget\n" + "".join(f"  {k}: {v}\n" for k, v in OLD_FLAT.items()))
    new = load_settings(None, compaction={"strategy": "budget", **NEW_NESTED, "mask": {"keep_tool_outputs": 7, "batch": 2}})
    monkeypatch.setenv("CONTEXT_PROXY_COMPACTION__KEEP_TOOL_OUTPUTS", "7")  # an old env name still wins over the YAML
    old = load_settings(config)
    assert old.compaction.model_dump() == new.compaction.model_dump()
    assert old.compaction.mask.keep_tool_outputs == 7
    assert old.moved_keys() == [
        "compaction.keep_tool_outputs -> compaction.mask.keep_tool_outputs",
        "compaction.mask_batch -> compaction.mask.batch",
        "compaction.every_n_user_messages -> compaction.turns.every_n_user_messages",
        "compaction.max_history_summary_length -> compaction.budget.max_history_summary_length",
        "compaction.compaction_percent -> compaction.budget.compaction_percent",
        "compaction.recent_context_messages -> compaction.budget.recent_context_messages",
    ]
    assert new.moved_keys() == []


def test_start_up_logs_each_old_name_it_read(caplog):
    from proxy.app import build_app

    settings = load_settings(
        None, compaction={"strategy": "mask", "mask_batch": 2},
        profiles={"p": {"compaction": {"every_n_user_messages": 3}}, "q": {"compaction": {"turns": {"every_n_user_messages": 3}}}},
    )
    with caplog.at_level("WARNING", logger="proxy"):
        build_app(settings)
    renamed = [r.setting for r in caplog.records if r.getMessage().startswith("setting renamed")]
    assert renamed == [
        "compaction.mask_batch -> compaction.mask.batch",
        "profiles.p.compaction.every_n_user_messages -> profiles.p.compaction.turns.every_n_user_messages",
    ]


@pytest.mark.parametrize(
    "compaction, named",
    [
        ({"keep_tool_outputs": 1, "mask": {"keep_tool_outputs": 2}}, "compaction: keep_tool_outputs is now mask.keep_tool_outputs"),
        ({"keep_tool_outputs": -1}, "compaction.mask.keep_tool_outputs: Input should be greater than or equal to 0"),
        ({"mask": {"mask_batch": 2}}, "compaction.mask.mask_batch: Extra inputs"),
        ({"mask": 3}, "compaction.mask: Input should be a valid dictionary"),
    ],
)
def test_a_bad_compaction_key_is_refused_naming_the_new_key(compaction, named):
    with pytest.raises(ConfigError, match=re.escape(named)):
        load_settings(None, compaction=compaction)
    with pytest.raises(ConfigError, match=re.escape(f"profiles.p.{named}")):
        load_settings(None, profiles={"p": {"compaction": compaction}})


def test_a_profile_overrides_only_the_keys_it_names_nested_sections_key_by_key(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(
        "truncation: {preview_length: 500, max_tool_response_length: 3000}\n"
        "compaction:\n  strategy: mask\n  mask: {keep_tool_outputs: 4, batch: 2}\n"
        "profiles:\n"
        "  small:\n"
        "    truncation: {max_tool_response_length: 1000}\n"  # valid only over the defaults' preview_length
        "    compaction: {strategy: off, mask: {keep_tool_outputs: 1}, every_n_user_messages: 3}\n"
        "    quota: {max_llm_calls: null}\n"
    )
    settings = load_settings(config)
    overrides = settings.profiles["small"]
    assert overrides.compaction.model_dump(exclude_unset=True) == {
        "strategy": "off", "mask": {"keep_tool_outputs": 1}, "turns": {"every_n_user_messages": 3},
    }
    small = settings.profile("small")
    assert small.compaction.strategy == "off"  # YAML's bare `off` (false) read as in the section itself
    assert (small.compaction.mask.keep_tool_outputs, small.compaction.mask.batch) == (1, 2)
    assert small.compaction.turns.every_n_user_messages == 3
    assert (small.truncation.preview_length, small.truncation.max_tool_response_length) == (500, 1000)
    assert small.quota.max_llm_calls is None
    assert settings.profile(None).compaction.mask.keep_tool_outputs == 4  # the defaults untouched


# -- the environment's values as their types; what settings never show or allow --------------------------------------


def test_env_values_are_read_as_their_keys_types(monkeypatch):
    monkeypatch.setenv("CONTEXT_PROXY_SERVER__FAST_PATH", "no")
    monkeypatch.setenv("context_proxy_server__max_body_mb", "8")  # any case, as before
    monkeypatch.setenv("CONTEXT_PROXY_SERVER__ALLOWED_HOSTS", '["proxy.internal"]')  # a tuple: JSON
    monkeypatch.setenv("CONTEXT_PROXY_MODELS", '{"Big-Model": {"history_token_limit": 100}}')
    monkeypatch.setenv("CONTEXT_PROXY_ADMIN__TOKEN", "s3cret-admin")
    monkeypatch.setenv("CONTEXT_PROXY_ADMIN_TOKEN", "not a setting of ours")  # no such section: left alone
    settings = load_settings(None)
    assert settings.server.fast_path is False and settings.server.max_body_mb == 8.0
    assert settings.server.allowed_hosts == ("proxy.internal",)
    assert settings.models["Big-Model"].history_token_limit == 100
    assert settings.admin.token.get_secret_value() == "s3cret-admin"
    assert "s3cret" not in repr(settings) and "s3cret" not in settings.admin.model_dump_json()


@pytest.mark.parametrize(
    "name, value, named",
    [
        ("CONTEXT_PROXY_SERVER__PROT", "80", "server.prot: Extra inputs are not permitted"),
        ("CONTEXT_PROXY_MODELS", "{not json", "models: CONTEXT_PROXY_MODELS is not valid JSON"),
        ("CONTEXT_PROXY_SERVER__FAST_PATH", "maybe", "server.fast_path: Input should be a valid boolean"),
        ("CONTEXT_PROXY_LOGGING__LEVEL", "LOUD", "logging.level: Input should be 'DEBUG', 'INFO', 'WARNING' or 'ERROR'"),
    ],
)
def test_a_bad_env_value_is_refused_naming_its_key(monkeypatch, name, value, named):
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=re.escape(named)):
        load_settings(None)


def test_settings_are_frozen():
    settings = load_settings(None)
    with pytest.raises(AttributeError, match="frozen"):
        settings.server.port = 1  # type: ignore[misc]
    assert settings.server.model_copy(update={"port": 1}).port == 1 and settings.server.port == 8080


def test_the_proxy_starts_without_pydantic():
    """Settings are read by proxy/settings_base.py: pydantic and pydantic-settings cost every proxy
    ~13 MB resident. (litellm, when a model routes through it, brings pydantic along.)"""
    probe = "import sys, proxy.cli, proxy.app; print(sorted({m.split('.')[0] for m in sys.modules if 'pydantic' in m}))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
