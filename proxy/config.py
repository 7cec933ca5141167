"""Typed, closed settings: one pydantic model per section of `config.yaml`.

Sources, strongest first: constructor arguments, env vars `CONTEXT_PROXY_<SECTION>__<KEY>`,
then the YAML file. Every section forbids unknown keys, so a typo stops start-up with the key
named instead of becoming a silent no-op.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

ENV_PREFIX = "CONTEXT_PROXY_"


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerSettings(Section):
    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(8080, ge=0, le=65535, description="Port to bind (0 = any free port).")
    max_body_mb: float = Field(32, gt=0, le=1024, description="Largest request body accepted (413 above).")


class UpstreamSettings(Section):
    base_url: str = Field("https://api.openai.com/v1", description="OpenAI-compatible base URL, /v1 included.")
    timeout_s: float = Field(600, gt=0, le=86400, description="Seconds of upstream silence before a 504.")
    api_key: SecretStr | None = Field(None, description="Sent upstream instead of the client's key when set.")
    max_connections: int = Field(100, ge=1, le=10000, description="Pooled connections to the upstream.")


class StorageSettings(Section):
    backend: Literal["diskcache", "redis"] = Field("diskcache", description="Which store backend to use.")
    path: Path = Field(Path("./data"), description="Directory of the diskcache store.")
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis URL for the redis backend.")


class ConversationSettings(Section):
    id_header: str = Field("X-Conversation-ID", min_length=1, description="Header naming the conversation.")
    history: Literal["full", "proxy"] = Field("full", description="Default history mode.")
    tenant_isolation: bool = Field(True, description="Namespace conversations by a hash of the API key.")


class AdminSettings(Section):
    token: SecretStr | None = Field(None, description="Bearer token of the admin API; unset = loopback only.")


class LoggingSettings(Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Log level.")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    server: ServerSettings = ServerSettings()
    upstream: UpstreamSettings = UpstreamSettings()
    storage: StorageSettings = StorageSettings()
    conversation: ConversationSettings = ConversationSettings()
    admin: AdminSettings = AdminSettings()
    logging: LoggingSettings = LoggingSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        yaml_file = settings_cls.model_config.get("yaml_file")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if yaml_file:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=yaml_file))
        return tuple(sources)


class ConfigError(Exception):
    """A setting is wrong; the message is one line naming it."""


def load_settings(config_path: str | Path | None = None, **overrides: object) -> Settings:
    """Read settings from `config_path` (if it exists), env vars and `overrides`."""
    if config_path is not None and not Path(config_path).is_file():
        raise ConfigError(f"config file not found: {config_path}")
    # pydantic-settings reads the YAML path from model_config; a subclass carries this file's path.
    cls = Settings
    if config_path is not None:
        cls = type("FileSettings", (Settings,), {"model_config": {**Settings.model_config, "yaml_file": str(config_path)}})
    try:
        return cls(**overrides)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc)) from None
    except (OSError, ValueError) as exc:  # unreadable or malformed YAML
        raise ConfigError(f"cannot read {config_path}: {exc}") from None


def _one_line(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "settings"
        parts.append(f"{where}: {err['msg']}")
    return "bad setting " + "; ".join(parts)
