"""Typed, closed settings: one section (proxy/settings_base.py) per section of `config.yaml`.

Sources, strongest first: `load_settings`'s arguments, env vars `CONTEXT_PROXY_<SECTION>__<KEY>`,
the seed's `DEFAULT_CONVERSATION_HISTORY_TOKEN_LIMIT`, then the YAML file. Every section forbids
unknown keys, so a typo stops start-up with the key named instead of becoming a silent no-op.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml

from .settings_base import Field, Private, Secret, Section, SettingsError, deep_merge, env_values, overrides_of

ENV_PREFIX = "CONTEXT_PROXY_"


class ServerSettings(Section):
    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(8080, ge=0, le=65535, description="Port to bind (0 = any free port).")
    max_body_mb: float = Field(32, gt=0, le=1024, description="Largest request body accepted (413 above).")
    max_messages: int = Field(
        10_000, ge=1, le=1_000_000, description="Most messages one request may carry (413 above)."
    )
    fast_path: bool = Field(
        True,
        description="A request that extends the conversation's previous one byte for byte costs only its new "
        "items (the previous turn's work is reused, to the same upstream bytes). false = every turn does all "
        "the work.",
    )
    cache_mb: float = Field(
        20,
        ge=0,
        le=65536,
        description="Memory for the previous request of recent conversations, parsed, so that a full-history "
        "client's next turn parses and rewrites only its new items; the fast path's memos of the work done on "
        "them take up to a quarter more, the prefix cache (clients whose bodies never extend the last one, "
        "e.g. Claude Code's) up to three quarters more; 0 = none. A 200-message agent transcript of 220 KB takes ~0.9 MB: more "
        "conversations taking turns at once than it holds cost CPU (each turn done whole), never correctness.",
    )
    allowed_hosts: tuple[str, ...] = Field(
        (),
        description="Host names (without port) accepted besides localhost and loopback addresses: on every "
        "route while the proxy listens on a loopback address, and on the admin API, /ui and /metrics "
        "whenever no admin token is set (a DNS-rebinding page names its own host). '*' accepts any.",
    )
    cors_origins: tuple[str, ...] = Field(
        (),
        description="Origins (scheme://host[:port]) whose web pages may call the proxy (CORS); a request "
        "from any other origin is refused with a 403.",
    )
    max_connections: int = Field(
        1000,
        ge=1,
        le=1_000_000,
        description="Client connections open at once; past it the longest-idle one is closed, or, when "
        "every one is busy, the new one is answered 503. Also kept below the process's fd limit.",
    )
    keepalive_timeout_s: float = Field(
        60, gt=0, le=3600, description="Seconds an idle keep-alive connection stays open."
    )
    header_timeout_s: float = Field(
        20, gt=0, le=600, description="Seconds a client may take to send a request's headers (slow clients are cut)."
    )
    body_timeout_s: float = Field(
        120, gt=0, le=86400, description="Seconds a client may take to send a request's body (408 after)."
    )
    malloc_arena_max: int = Field(
        2,
        ge=0,
        le=1024,
        description="glibc malloc arenas (Linux): the event loop's, and one every other thread shares (the "
        "store's, token counting's); memory one arena freed is reused by the others' threads only within it. "
        "0 = glibc's default (8 per core). MALLOC_ARENA_MAX, if set, wins.",
    )
    malloc_mmap_threshold_kb: int = Field(
        0,
        ge=0,
        le=32768,
        description="glibc malloc: blocks of this many KB or more (request and upstream bodies) are mapped on "
        "their own and go back to the system when freed, instead of leaving holes in the heap. 128 takes ~10 MB "
        "off the bench's peak and costs ~7% more CPU a turn, ~20% a streamed chunk (every socket read's 256 KB "
        "buffer is mapped). 0 = glibc's default (a threshold that rises with every large block freed). "
        "MALLOC_MMAP_THRESHOLD_, if set, wins.",
    )
    malloc_trim_interval_s: float = Field(
        1.0,
        ge=0,
        le=3600,
        description="glibc malloc: once resident memory grew by 2 MB (looked at 4 times in this many seconds under "
        "load, at each client's request otherwise), or, the process idle over them, as much was freed, hand the free "
        "pages in the middle of the heap back to the system (malloc_trim, in a thread; ~1-5 ms); then wait for the "
        "next client. 0 = never.",
    )


class UpstreamSettings(Section):
    base_url: str = Field(
        "https://api.openai.com/v1",
        description="OpenAI-compatible base URL, /v1 included. A user:password in it is sent as Basic auth "
        "instead of the client's Authorization, and never logged.",
    )
    timeout_s: float = Field(600, gt=0, le=86400, description="Seconds of upstream silence before a 504.")
    api_key: Secret | None = Field(None, description="Sent upstream instead of the client's key when set.")
    max_connections: int = Field(100, ge=1, le=10000, description="Pooled connections to the upstream.")
    max_reply_mb: float = Field(
        32,
        gt=0,
        le=4096,
        description="Largest upstream reply read for a chat turn (JSON body or event stream), and largest body "
        "ever buffered; past it the reply is cut with an upstream_reply_too_large error.",
    )
    max_sse_line_mb: float = Field(
        4, gt=0, le=1024, description="Longest line of an upstream event stream (one SSE event's data)."
    )
    max_reply_s: float = Field(
        1800,
        gt=0,
        le=86400,
        description="Longest a chat turn's upstream reply may take, from the request sent to its last byte, "
        "however steadily it trickles (a 504 after; timeout_s bounds each silence within it).",
    )
    anthropic_base_url: str = Field(
        "https://api.anthropic.com", description="Anthropic API root for Messages requests (no /v1)."
    )
    anthropic_api_key: Secret | None = Field(
        None, description="Sent to the Anthropic API as x-api-key instead of the client's key when set."
    )
    gemini_base_url: str = Field(
        "https://generativelanguage.googleapis.com", description="Gemini API root for Gemini requests (no /v1beta)."
    )

    def _check(self) -> None:
        if self.api_key is not None and "@" in self.base_url.split("//", 1)[-1].split("/", 1)[0]:
            raise ValueError("base_url holds credentials and api_key is set too: use one of them")


class StorageSettings(Section):
    backend: Literal["diskcache", "redis"] = Field("diskcache", description="Which store backend to use.")
    path: Path = Field(Path("./data"), description="Directory of the diskcache store.")
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis URL for the redis backend.")
    redis_lock_ttl_s: float = Field(
        10, gt=0, le=600, description="How long a crashed replica can hold a conversation's lock (renewed while alive)."
    )
    trajectory_dir: Path | None = Field(
        None, description="Write each conversation's trajectory to <dir>/<tenant>/<id>.json after each turn (off when null)."
    )
    trajectory_cache_mb: float = Field(
        64, ge=0, le=65536, description="Memory for the encoded trajectories of recent conversations (so a turn re-encodes only what changed)."
    )
    reserve_mb: float = Field(
        16,
        ge=0,
        le=4096,
        description="diskcache: disk space held in reserve and released when the disk is full, so that "
        "deleting conversations (which needs room for SQLite's journal) still works; 0 = none.",
    )


class ConversationSettings(Section):
    id_header: str = Field("X-Conversation-ID", min_length=1, description="Header naming the conversation.")
    history: Literal["full", "proxy"] = Field("full", description="Default history mode.")
    tenant_isolation: bool = Field(True, description="Namespace conversations by a hash of the API key.")


class AdminSettings(Section):
    token: Secret | None = Field(
        None,
        description="Bearer token of the admin API; unset = one the proxy makes and keeps in "
        "<storage.path>/admin-token (0600), printed at start-up as a /ui URL.",
    )


class ContextSettings(Section):
    history_token_limit: int = Field(
        10000, ge=64, le=10_000_000, description="Token budget of the history sent upstream (system excluded)."
    )
    window_refill: float = Field(
        0.6,
        gt=0,
        le=1,
        description="When the history no longer fits the limit, the window's start moves forward so that it fills "
        "this share of it, and stays until the limit is reached again: between cuts each prompt extends the "
        "previous one (prompt caches). 1 = slide every turn.",
    )


ToolHandling = Literal["truncate", "summarize", "keep"]


class TruncationSettings(Section):
    enabled: bool = Field(True, description="Shorten long tool outputs before they go upstream.")
    max_tool_response_length: int = Field(10000, ge=200, description="Tool outputs longer than this (chars) are shortened.")
    preview_length: int = Field(2000, ge=0, description="Characters of a truncated output kept as its preview.")
    default: ToolHandling = Field("truncate", description="Handling of tools not named in `tools`.")
    tools: dict[str, ToolHandling] = Field(default_factory=dict, description="Handling per tool name.")
    read_length: int = Field(8000, ge=100, description="Most characters one read_tool_output call returns.")
    max_read_rounds: int = Field(4, ge=0, le=20, description="read_tool_output rounds per request before the model must answer.")

    def _check(self) -> None:
        if self.preview_length >= self.max_tool_response_length:
            raise ValueError("preview_length must be smaller than max_tool_response_length")


class QuotaSettings(Section):
    max_llm_calls: int | None = Field(None, ge=1, description="Upstream calls allowed per conversation; null = no quota.")
    on_exhausted: Literal["reject", "warn"] = Field("reject", description="Past the quota: 429, or forward with a warning.")


class MaskSettings(Section):
    keep_tool_outputs: int = Field(10, ge=0, description="The newest N tool outputs stay whole.")
    batch: int = Field(
        10, ge=1, le=1000,
        description="Older outputs are masked this many at a time, so the prompt changes once per batch, "
        "not every turn (prompt caches).",
    )


class TurnsSettings(Section):
    every_n_user_messages: int = Field(10, ge=1, description="Summarize after N new user messages.")


class BudgetSettings(Section):
    max_history_summary_length: int = Field(
        40000, ge=1000, description="Summarize once the summary plus the live history exceed this many characters."
    )
    compaction_percent: int = Field(50, ge=1, le=100, description="Share of the history a window takes.")
    recent_context_messages: int = Field(6, ge=0, le=100, description="Messages after the window shown to the summarizer.")


# Keys of `compaction` that moved into their strategy's section: old flat name -> (section, key).
# The old names still work (start-up logs each one it met, see Settings.moved_keys).
MOVED_COMPACTION_KEYS: dict[str, tuple[str, str]] = {
    "keep_tool_outputs": ("mask", "keep_tool_outputs"),
    "mask_batch": ("mask", "batch"),
    "every_n_user_messages": ("turns", "every_n_user_messages"),
    "max_history_summary_length": ("budget", "max_history_summary_length"),
    "compaction_percent": ("budget", "compaction_percent"),
    "recent_context_messages": ("budget", "recent_context_messages"),
}


class CompactionSettings(Section):
    """How history is compacted: the strategy, each strategy's own section, and what the two
    summarizing strategies (turns, budget) share."""

    strategy: Literal["off", "mask", "turns", "budget"] = Field(
        "off",
        description="How history is compacted. A strategy's own keys are under its name (compaction.mask.*, .turns.*, "
        ".budget.*); their old flat names (e.g. compaction.keep_tool_outputs) still work, with a warning at start-up.",
    )
    mask: MaskSettings = Field(MaskSettings(), description="mask: older tool outputs become placeholders (no LLM).")
    turns: TurnsSettings = Field(TurnsSettings(), description="turns: a summary every N user messages.")
    budget: BudgetSettings = Field(BudgetSettings(), description="budget: a summary once the history outgrows a size.")
    background: bool = Field(True, description="Summarize after the reply (true) or before forwarding (false).")
    max_summarizer_input_tokens: int = Field(
        60000, ge=1000, description="Larger windows are summarized in chunks of this size."
    )
    max_summary_tokens: int = Field(
        1024, ge=64, le=32768, description="The summarizer's max_tokens; a longer answer is cut to it."
    )
    max_key_facts: int = Field(100, ge=0, le=500, description="Most statements kept as key facts.")
    key_facts_chars: int = Field(
        3000, ge=0, le=100_000, description="Characters of the key facts list; the least salient go first past it."
    )
    user_messages_chars: int = Field(
        12000, ge=500, le=200_000,
        description="Characters of the user's own messages a summary carries; past it the oldest are shortened to a head and a ref.",
    )
    retry_backoff_s: float = Field(
        60, ge=0, le=86400, description="After a failed summary, wait this long (doubling per failure) and at least one turn."
    )
    compactor_class: str | None = Field(
        "proxy.compaction.llm.LLMCompactor", description="Dotted path of the compactor class (turns/budget)."
    )

    # The old flat names this section was given, with their new names (for the start-up log).
    _moved: tuple[tuple[str, str], ...] = Private(tuple)

    @classmethod
    def _prepare(cls, data: dict[str, Any]) -> dict[str, Any]:
        """Read the keys that moved into mask/turns/budget under their old flat names too; both
        names at once is an error naming the new one. YAML 1.1 reads an unquoted `off` (and `no`,
        `false`) as false: that is the strategy `off`."""
        strategy = data.get("strategy")
        if strategy is False or (isinstance(strategy, str) and strategy.strip().lower() == "false"):
            data["strategy"] = "off"
        moved = []
        for old, (section, key) in MOVED_COMPACTION_KEYS.items():
            if old not in data:
                continue
            inner = data.get(section, {})
            if isinstance(inner, Section):
                inner = inner.model_dump(exclude_unset=True)
            if not isinstance(inner, dict):
                continue  # a malformed section: its own check names it
            if key in inner:
                raise ValueError(f"{old} is now {section}.{key}: set only {section}.{key}")
            data[section] = {**inner, key: data.pop(old)}
            moved.append((old, f"{section}.{key}"))
        if moved:
            data["_moved"] = tuple(moved)
        return data


# A knowledge namespace: the charset of conversation ids, shorter. "versions" and "diff" name
# admin API paths under /v1/knowledge, so no namespace may take them.
KNOWLEDGE_NAMESPACE = re.compile(r"[A-Za-z0-9._:-]{1,64}")
RESERVED_NAMESPACES = frozenset({"versions", "diff"})


def is_knowledge_namespace(value: str) -> bool:
    return bool(KNOWLEDGE_NAMESPACE.fullmatch(value)) and value not in RESERVED_NAMESPACES and set(value) != {"."}


def _namespace(value: str | None) -> str | None:
    if value is not None and not is_knowledge_namespace(value):
        raise ValueError("a namespace is 1-64 characters of A-Z a-z 0-9 . _ : - (not 'versions' or 'diff')")
    return value


class KnowledgeSettings(Section):
    enabled: bool = Field(
        False, description="Send the tenant's long-term knowledge document upstream and offer the tools that edit it."
    )
    namespace: str | None = Field(
        None, check=_namespace, description="The document's namespace (X-Knowledge-Namespace wins); null = the tenant's default document."
    )
    max_tokens: int = Field(
        2000, ge=100, le=100_000,
        description="Most tokens the document takes in the prompt (its system message); the agent's edits keep within.",
    )
    editable: bool = Field(
        False,
        description="Offer the agent the tools that edit the document (reading it is always offered). Off by "
        "default: one prompt injection would otherwise persist in every later conversation of the tenant.",
    )


class Profile(Section):
    """The per-request settings of every pipeline stage: the defaults, or a profile's overrides of them."""

    context: ContextSettings = ContextSettings()
    truncation: TruncationSettings = TruncationSettings()
    compaction: CompactionSettings = CompactionSettings()
    quota: QuotaSettings = QuotaSettings()
    knowledge: KnowledgeSettings = KnowledgeSettings()


PROFILE_SECTIONS = ("context", "truncation", "compaction", "quota", "knowledge")


ContextOverrides = overrides_of(ContextSettings)
TruncationOverrides = overrides_of(TruncationSettings)
CompactionOverrides = overrides_of(CompactionSettings)
QuotaOverrides = overrides_of(QuotaSettings)
KnowledgeOverrides = overrides_of(KnowledgeSettings)


class ProfileOverrides(Section):
    """One entry of `profiles:`: the keys of the per-conversation sections it changes."""

    context: ContextOverrides = ContextOverrides()  # type: ignore[valid-type]
    truncation: TruncationOverrides = TruncationOverrides()  # type: ignore[valid-type]
    compaction: CompactionOverrides = CompactionOverrides()  # type: ignore[valid-type]
    quota: QuotaOverrides = QuotaOverrides()  # type: ignore[valid-type]
    knowledge: KnowledgeOverrides = KnowledgeOverrides()  # type: ignore[valid-type]

    def merged_over(self, default: Profile) -> dict[str, Any]:
        """`default` as a dict, with the keys this profile sets put in (into nested sections key by key)."""
        return {
            section: _merge(getattr(default, section), getattr(self, section).model_dump(exclude_unset=True))
            for section in PROFILE_SECTIONS
        }


def _merge(base: Section, changes: dict[str, Any]) -> dict[str, Any]:
    merged = base.model_dump()
    for key, value in changes.items():
        inner = getattr(base, key)
        merged[key] = _merge(inner, value) if isinstance(inner, Section) else value
    return merged


class InboxSettings(Section):
    max_message_chars: int = Field(8000, ge=1, le=100_000, description="Longest inbox message accepted (characters).")
    max_pending: int = Field(
        50, ge=1, le=1000, description="Most undelivered inbox messages a conversation holds (429 past it)."
    )


class SummarizerSettings(Section):
    model: str | None = Field(
        None,
        description="Model that writes summaries, asked in chat completions; null = the request's own model with the "
        "client's key (for an Anthropic Messages conversation: asked in Messages at the Anthropic API).",
    )
    timeout_s: float = Field(120, gt=0, le=3600, description="Longest a summary may take before it counts as failed.")
    yield_to_agent: bool = Field(
        False,
        description="Queue summaries behind the agent's requests to the same upstream and stop one when an agent "
        "request starts (a local model serving one request at a time).",
    )


def _key_is_set(name: str | None) -> str | None:
    # Checked at start-up so a missing key stops the proxy instead of failing every request;
    # the value itself is read again at each call (rotation without a restart).
    if name is not None and not os.environ.get(name):
        raise ValueError(f"environment variable {name} is not set")
    return name


class ModelSettings(Section):
    """One entry of `models:`, keyed by the public model name clients send.

    With `litellm_model` set, the model's requests go through litellm to that provider and come
    back in OpenAI format; without it, the entry only carries settings (profile, limits, window)
    for a model of the passthrough upstream.
    """

    profile: str | None = Field(None, description="Profile used for this model unless X-Context-Profile names one.")
    history_token_limit: int | None = Field(None, ge=64, description="This model's history token budget.")
    litellm_model: str | None = Field(
        None,
        min_length=1,
        description="litellm model string, e.g. 'anthropic/claude-3-5-sonnet-20241022', 'gemini/gemini-2.0-flash', "
        "'ollama_chat/llama3.1', 'hosted_vllm/Qwen/Qwen2.5-7B-Instruct'; null = served by the passthrough upstream.",
    )
    api_base: str | None = Field(
        None, min_length=1, description="Provider base URL (litellm's api_base); null = the provider's default."
    )
    api_key_env: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        check=_key_is_set,
        description="NAME of the env var holding the provider key (read at each call, never logged); "
        "null = litellm's own default variable for the provider (e.g. ANTHROPIC_API_KEY), if any.",
    )
    forward_client_key: bool = Field(
        False,
        description="Send the client's own Bearer key as the provider key (only when api_key_env is not set).",
    )
    extra_headers: dict[str, str] = Field(default_factory=dict, description="Extra HTTP headers sent to the provider.")
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra litellm.acompletion keyword arguments (e.g. temperature, max_tokens, drop_params, "
        "num_retries); they win over the request's own parameters.",
    )
    timeout_s: float | None = Field(
        None, gt=0, le=86400, description="Seconds of provider silence before a 504; null = upstream.timeout_s."
    )
    context_window: int | None = Field(
        None, ge=256, description="Context window in tokens, when litellm's model table lacks or misstates it."
    )

    # Fields that only mean something for a litellm-routed model.
    LITELLM_ONLY: ClassVar[tuple[str, ...]] = (
        "api_base", "api_key_env", "forward_client_key", "extra_headers", "params", "timeout_s",
    )
    # litellm.acompletion arguments the proxy sets itself: `params` may not override them.
    RESERVED_PARAMS: ClassVar[frozenset[str]] = frozenset(
        {"model", "messages", "stream", "api_key", "api_base", "base_url", "extra_headers", "headers", "timeout",
         "client"}
    )

    def _check(self) -> None:
        if self.litellm_model is None:
            used = [name for name in self.LITELLM_ONLY if name in self.model_fields_set]
            if used:
                raise ValueError(f"{', '.join(used)} only apply to a model with litellm_model set")
        reserved = sorted(self.RESERVED_PARAMS.intersection(self.params))
        if reserved:
            raise ValueError(
                f"params may not set {', '.join(reserved)} "
                "(use litellm_model, api_base, api_key_env, extra_headers, timeout_s)"
            )


def _http_url(value: str | None) -> str | None:
    if value is not None and not value.startswith(("http://", "https://")):
        raise ValueError("must be an http:// or https:// URL (OTLP over HTTP)")
    return value


class TelemetrySettings(Section):
    otlp_endpoint: str | None = Field(
        None,
        check=_http_url,
        description="OTLP/HTTP collector for traces: a base URL (http://host:4318, traces go to its /v1/traces) "
        "or the full traces URL; null = the OTEL_EXPORTER_OTLP_* variables decide (unset: no traces).",
    )
    capture_content: bool = Field(
        False, description="Put message contents on the spans (gen_ai.input/output.messages): they may hold secrets."
    )
    service_name: str = Field("context-proxy", min_length=1, description="The spans' service.name, unless OTEL_SERVICE_NAME sets one.")
    max_attribute_chars: int = Field(
        32768, ge=256, le=10_000_000, description="Longest span attribute value: captured contents are cut to it."
    )


class LoggingSettings(Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Log level.")
    format: Literal["auto", "text", "json"] = Field(
        "auto",
        description="Log lines as text for a person (with a start banner saying where to point each client) or as "
        "JSON objects for a collector; auto = text when stderr is a terminal, JSON otherwise (a pipe, a file, Docker).",
    )


class Settings(Section):
    """Every setting. `load_settings` reads them from their sources."""

    server: ServerSettings = ServerSettings()
    upstream: UpstreamSettings = UpstreamSettings()
    storage: StorageSettings = StorageSettings()
    conversation: ConversationSettings = ConversationSettings()
    admin: AdminSettings = AdminSettings()
    logging: LoggingSettings = LoggingSettings()
    telemetry: TelemetrySettings = TelemetrySettings()
    context: ContextSettings = ContextSettings()
    truncation: TruncationSettings = TruncationSettings()
    compaction: CompactionSettings = CompactionSettings()
    quota: QuotaSettings = QuotaSettings()
    knowledge: KnowledgeSettings = KnowledgeSettings()
    inbox: InboxSettings = InboxSettings()
    summarizer: SummarizerSettings = SummarizerSettings()
    profiles: dict[str, ProfileOverrides] = Field(
        default_factory=dict,
        description="Named sets of overrides of the per-conversation sections, chosen by X-Context-Profile or a model's profile.",
    )
    models: dict[str, ModelSettings] = Field(default_factory=dict, description="Settings per requested model name.")

    _profiles: dict[str | None, Profile] = Private(dict)

    def _check(self) -> None:
        """Merge each profile over the defaults once, so a bad override stops start-up, naming it."""
        default = Profile(
            context=self.context, truncation=self.truncation, compaction=self.compaction, quota=self.quota,
            knowledge=self.knowledge,
        )
        self._profiles[None] = default
        for name, overrides in self.profiles.items():
            try:
                self._profiles[name] = Profile.model_validate(overrides.merged_over(default))
            except SettingsError as exc:
                raise ValueError(f"profiles.{name}: {exc.one_line()}") from None
        for model, entry in self.models.items():
            if entry.profile is not None and entry.profile not in self.profiles:
                raise ValueError(f"models.{model}.profile: no profile named {entry.profile!r}")

    def moved_keys(self) -> list[str]:
        """The keys given under an old name, as "old -> new" (start-up logs them: the old names go one day)."""
        where = [("compaction", self.compaction)]
        where += [(f"profiles.{name}.compaction", overrides.compaction) for name, overrides in self.profiles.items()]
        return [f"{path}.{old} -> {path}.{new}" for path, section in where for old, new in section._moved]

    def profile(self, name: str | None) -> Profile | None:
        """The merged settings of profile `name` (None = the defaults); None if there is no such profile."""
        return self._profiles.get(name)

    def named_profiles(self) -> dict[str | None, Profile]:
        """Every profile by name (None = the defaults)."""
        return dict(self._profiles)


# The seed's own env var for the history budget: below CONTEXT_PROXY_* vars, above the YAML.
LEGACY_TOKEN_LIMIT_ENV = "DEFAULT_CONVERSATION_HISTORY_TOKEN_LIMIT"


class ConfigError(Exception):
    """A setting is wrong; the message is one line naming it."""


def load_settings(config_path: str | Path | None = None, **overrides: object) -> Settings:
    """Read settings from `config_path` (if it exists), env vars and `overrides`, strongest last."""
    if config_path is not None and not Path(config_path).is_file():
        raise ConfigError(f"config file not found: {config_path}")
    try:
        from_file = _read_yaml(Path(config_path)) if config_path is not None else {}
    except (OSError, TypeError, ValueError, yaml.YAMLError) as exc:  # unreadable or malformed YAML
        raise ConfigError(f"cannot read {config_path}: {' '.join(str(exc).split())}") from None  # one line
    legacy = os.environ.get(LEGACY_TOKEN_LIMIT_ENV)
    try:
        from_env = env_values(Settings, ENV_PREFIX, os.environ)
        layers = [from_file, {"context": {"history_token_limit": legacy}} if legacy else {}, from_env, overrides]
        return Settings.model_validate(deep_merge(*layers))
    except SettingsError as exc:
        raise ConfigError(exc.one_line(prefix="bad setting ")) from None


def _read_yaml(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise TypeError("the file must hold a mapping of sections to their keys")
    return data
