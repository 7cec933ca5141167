"""Token counting for the token window: tiktoken, cached per message, plus the context windows
litellm knows.

- OpenAI models: o200k_base (gpt-4o, 4.1, 4.5, 5, o-series, gpt-oss) or cl100k_base (gpt-4,
  gpt-3.5, and any name tiktoken does not know).
- Other models: cl100k_base too, by default. For claude-3+, gemini, mistral, ... litellm's own
  `token_counter` falls back to cl100k_base anyway, while importing litellm costs ~2 s and
  ~190 MB resident, and for llama/cohere names it downloads a tokenizer from the Hugging Face hub
  (retrying for ~20 s when offline). `TokenCounter(use_litellm=True)` opts into litellm's counter.
- Offline: tiktoken downloads its encodings unless they are in its cache dir; litellm's wheel
  ships the two we use, so TIKTOKEN_CACHE_DIR points there (found without importing litellm).
- Each message is tokenized once: counts are cached by a hash of exactly what is counted.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from .messages import Message

log = logging.getLogger("proxy.tokens")

Encode = Callable[[str], int]  # text -> number of tokens
PartsOf = Callable[[Message], tuple[tuple[str, ...], int]]  # a message -> (its texts, flat tokens)

# OpenAI's chat framing (openai-cookbook "How to count tokens"): every message costs 3 tokens
# besides its role and content, a `name` one more. Tool calls are not documented: 3 per call
# covers their wrapper in practice. Images are billed by size; 765 is a 1024x1024 image at high
# detail, 85 at low detail. Audio/file parts get the image figure: an estimate, not a bill.
PER_MESSAGE = 3
PER_NAME = 1
PER_TOOL_CALL = 3
IMAGE_TOKENS = 765
LOW_DETAIL_IMAGE_TOKENS = 85

# Counts kept: ~115 bytes each (a dict slot, the key's and the count's ints; measured with
# bench/memory_breakdown.py), so 2.3 MB: the messages of ~60 conversations of 300 (a turn on the
# fast path counts only its new items; a whole-pipeline turn counts them all again, from here).
DEFAULT_CACHE_ENTRIES = 20_000
OFFLOAD_CHARS = 32_000  # new text beyond this is tokenized off the event loop
OFFLOAD_MESSAGES = 1_000  # and so are this many new messages, however short
# Tokenizing is not linear in a text's length (BPE on a long run without spaces is about
# quadratic: 400,000 'x' take 1.2 s) and holds every token id: one 30 MB message cost 1.7 GB.
# So a text is tokenized in pieces of PIECE_CHARS (cut at whitespace where there is some: only a
# token across a cut can count twice), and one longer than EXACT_CHARS is estimated from
# SAMPLES evenly spread pieces: time and memory stay flat whatever the size.
PIECE_CHARS = 4_096
EXACT_CHARS = 262_144
SAMPLES = 16
FALLBACK_ENCODING = "cl100k_base"
# A short text (a role, a tool's name, a call id, which a call and its result both carry) costs
# tiktoken ~2-5 us a call, mostly the call itself: its count is kept, up to SHORT_TEXTS of them
# per tokenizer (the memo is emptied when full: bounded, and the common ones come straight back).
SHORT_TEXT_CHARS = 32
SHORT_TEXTS = 4_096
MODEL_PRICES_FILE = "model_prices_and_context_window_backup.json"
# The rough rule for text no tokenizer counted (what a stage left out, a trace's estimate, a
# missing encoding): about 4 characters of English or code per token.
CHARS_PER_TOKEN = 4


def estimated_tokens(chars: int) -> int:
    """Tokens of a text of `chars` characters by the rough rule, rounded up (a budget is better
    overestimated)."""
    return -(-chars // CHARS_PER_TOKEN)


class TokenCounter:
    """Counts chat messages in tokens, each distinct message once (a bounded LRU cache).

    Thread-safe: one instance serves the whole process (the event loop and background work).
    """

    def __init__(
        self,
        max_entries: int = DEFAULT_CACHE_ENTRIES,
        use_litellm: bool = False,
        windows: Mapping[str, int] | None = None,
        aliases: Mapping[str, str] | None = None,
    ) -> None:
        self.max_entries = max_entries
        self.use_litellm = use_litellm
        self.windows = dict(windows or {})  # model -> context window, from `models:` (wins over litellm's table)
        self.aliases = dict(aliases or {})  # public model name -> the litellm model it really is
        self.encodes = 0  # distinct messages actually tokenized (cache misses): for tests and metrics
        # hash of (tokenizer, counted texts, flat extras) -> tokens. Insertion order is the LRU
        # order: a hit is popped and put back at the end, the first key is the oldest.
        self._cache: dict[int, int] = {}
        self._lock = threading.Lock()
        self._loaded: set[str] = set()  # tokenizers loaded so far (each on first need: o200k_base is ~48 MB)

    async def ready(self, model: str) -> None:
        """Load `model`'s tokenizer, in a thread, if no request needed it yet: after this, counting
        for `model` on the event loop never stalls it on a load (~0.2 s for o200k_base)."""
        tokenizer = self.tokenizer_name(model)
        if tokenizer not in self._loaded:
            await asyncio.to_thread(self._encoder, tokenizer, model)

    def count(self, message: Message, model: str) -> int:
        """Tokens of one chat message as OpenAI counts it, framing overhead included."""
        return self.count_many([message], model)[0]

    def count_texts(self, texts: Sequence[str], model: str) -> int:
        """Tokens of plain texts (tool schemas, instructions), each counted once and cached."""
        if not texts:
            return 0
        return sum(self.count_many([{"content": t} for t in texts], model, parts=_plain_text))

    def count_many(self, messages: Sequence[Message], model: str, parts: PartsOf | None = None) -> list[int]:
        """`count` of each message: one tokenizer lookup and one lock round for the whole prompt.
        `parts` reads a message of another wire format (a dialect's `counted_parts`)."""
        tokenizer, keys, counts, misses = self._lookup(messages, model, None, parts or counted_parts)
        made = self._encode_misses(tokenizer, model, misses) if misses else {}
        return [made[key] if tokens is None else tokens for key, tokens in zip(keys, counts, strict=True)]

    async def count_many_async(
        self,
        messages: Sequence[Message],
        model: str,
        hashes: Sequence[str | None] | None = None,
        parts: PartsOf | None = None,
    ) -> list[int]:
        """`count_many` for the event loop: cache hits inline, a large amount of new text in a thread
        (tokenizing 200 KB takes ~15 ms, too long to hold the loop). `hashes`, where given, are the
        messages' canonical hashes: cache keys that spare walking a message again."""
        tokenizer, keys, counts, misses = self._lookup(messages, model, hashes, parts or counted_parts)
        made: dict[int, int] = {}
        if misses:
            chars = sum(len(t) for texts, _ in misses.values() for t in texts)
            if chars > OFFLOAD_CHARS or len(misses) > OFFLOAD_MESSAGES or tokenizer not in self._loaded:
                made = await asyncio.to_thread(self._encode_misses, tokenizer, model, misses)
            else:
                made = self._encode_misses(tokenizer, model, misses)
        return [made[key] if tokens is None else tokens for key, tokens in zip(keys, counts, strict=True)]

    def _lookup(
        self, messages: Sequence[Message], model: str, hashes: Sequence[str | None] | None, parts_of: PartsOf
    ) -> tuple[str, list[int], list[int | None], dict[int, tuple[tuple[str, ...], int]]]:
        tokenizer = self.tokenizer_name(model)
        # A message's key: its canonical hash where the caller has it, else a hash of exactly what
        # is counted (Python's str hash is cached on the string: no JSON dump, no sha256).
        parts: dict[int, tuple[tuple[str, ...], int]] = {}
        keys = []
        for i, message in enumerate(messages):
            known = hashes[i] if hashes is not None else None
            if known is not None:
                keys.append(hash((tokenizer, known)))
            else:
                parts[i] = parts_of(message)
                keys.append(hash((tokenizer, *parts[i])))
        cache = self._cache
        counts: list[int | None] = []
        with self._lock:
            for key in keys:  # one at a time: a message repeated in the prompt must hit the second time too
                tokens = cache.pop(key, None)
                if tokens is not None:
                    cache[key] = tokens  # back at the end: most recently used
                counts.append(tokens)
        misses = {
            keys[i]: parts[i] if i in parts else parts_of(messages[i])
            for i, tokens in enumerate(counts)
            if tokens is None
        }
        return tokenizer, keys, counts, misses

    def _encode_misses(self, tokenizer: str, model: str, misses: dict[int, tuple[tuple[str, ...], int]]) -> dict[int, int]:
        encode = self._encoder(tokenizer, model)  # tokenized outside the lock
        made = {
            key: extra + sum(count_text(encode, text) for text in texts if text) for key, (texts, extra) in misses.items()
        }
        with self._lock:
            self.encodes += len(made)
            self._cache.update(made)
            while len(self._cache) > self.max_entries:
                del self._cache[next(iter(self._cache))]
        return made

    def tokenizer_name(self, model: str) -> str:
        """The tokenizer `count` uses for `model`: a tiktoken encoding name, or 'litellm:<model>'."""
        model = self.aliases.get(model, model)
        name = encoding_name(model)
        if self.use_litellm and name is None:
            return f"litellm:{model}"
        return name or FALLBACK_ENCODING

    def context_window(self, model: str) -> int | None:
        """The model's max input tokens where litellm's bundled table knows the model, else None."""
        if model in self.windows:
            return self.windows[model]
        model = self.aliases.get(model, model)
        windows = context_windows()
        for name in lookup_names(model):
            if name in windows:
                return windows[name]
        return None

    def warm(self, models: Iterable[str] = ()) -> None:
        """Load the window table and the tokenizers of `models` now (at start-up, off the request
        path): o200k_base takes ~0.2 s to load, cl100k_base ~0.1 s, the table ~20-40 ms."""
        context_windows()
        for model in models:
            tokenizer = self.tokenizer_name(model)
            self._encoder(tokenizer, model)

    def _encoder(self, tokenizer: str, model: str) -> Encode:
        encode = litellm_encoder(self.aliases.get(model, model)) if tokenizer.startswith("litellm:") else tiktoken_encoder(tokenizer)
        self._loaded.add(tokenizer)
        return encode


def count_text(encode: Encode, text: str) -> int:
    """Tokens of `text`: exact up to EXACT_CHARS (in pieces), estimated from samples beyond."""
    if len(text) <= PIECE_CHARS:
        return encode(text)
    if len(text) <= EXACT_CHARS:
        return sum(encode(piece) for piece in _pieces(text, 0, len(text)))
    step = len(text) // SAMPLES
    sampled_chars = sampled_tokens = 0
    for i in range(SAMPLES):
        piece = next(_pieces(text, i * step, i * step + PIECE_CHARS))
        sampled_chars += len(piece)
        sampled_tokens += encode(piece)
    return -(-len(text) * sampled_tokens // sampled_chars)  # rounded up: a budget is better overestimated


def _pieces(text: str, start: int, end: int) -> Iterator[str]:
    """text[start:end] in pieces of at most PIECE_CHARS, each cut just before whitespace when the
    last eighth of the piece has some (tiktoken's pieces start at a space: the cut splits none)."""
    while start < end:
        stop = min(start + PIECE_CHARS, end)
        if stop < end:
            floor = stop - PIECE_CHARS // 8
            space = max(text.rfind(" ", floor, stop), text.rfind("\n", floor, stop))
            if space > start:
                stop = space
        yield text[start:stop]
        start = stop


def counted_parts(message: Message) -> tuple[tuple[str, ...], int]:
    """(every text of the message that is tokenized, the flat tokens added to them).

    One function decides both what is counted and what the cache key covers, so they can't drift.
    It runs for every message of every request, hence the plain loops.
    """
    get = message.get
    texts: list[str] = [str(get("role") or "")]
    extra = PER_MESSAGE
    content = get("content")
    if isinstance(content, str):
        texts.append(content)
    elif isinstance(content, list):
        extra += _add_parts(content, texts)
    for key in ("refusal", "tool_call_id", "name"):
        value = get(key)
        if isinstance(value, str):
            texts.append(value)
            extra += PER_NAME if key == "name" else 0
    calls = get("tool_calls")
    if isinstance(get("function_call"), dict):  # legacy single call
        calls = [*(calls or ()), {"function": get("function_call")}]
    for call in calls or ():
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            texts.extend(v for v in (call.get("id"), fn.get("name"), fn.get("arguments")) if isinstance(v, str))
            extra += PER_TOOL_CALL
    return tuple(texts), extra


def _plain_text(message: Message) -> tuple[tuple[str, ...], int]:
    return (message["content"],), 0


def _add_parts(parts: list[Any], texts: list[str]) -> int:
    """Append the text of each content part to `texts`; return the flat tokens of the others."""
    extra = 0
    for part in parts:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind in ("text", "refusal") and isinstance(part.get(kind), str):
            texts.append(part[kind])
        elif (
            kind == "image_url" and isinstance(part.get("image_url"), dict) and part["image_url"].get("detail") == "low"
        ):
            extra += LOW_DETAIL_IMAGE_TOKENS
        else:
            extra += IMAGE_TOKENS
    return extra


# -- tokenizers ---------------------------------------------------------------------------------


@lru_cache(maxsize=1024)  # model names come from clients: bounded
def encoding_name(model: str) -> str | None:
    """'o200k_base' or 'cl100k_base' for the models tiktoken knows, None for the others.

    A provider prefix ('openai/', 'azure/', 'openrouter/openai/') is ignored. Legacy encodings
    (p50k, r50k) are not bundled with litellm, so their models are counted with cl100k_base.
    """
    import tiktoken.model  # light (~10 ms, no encoding loaded)

    base = model.rsplit("/", 1)[-1]
    try:
        name = tiktoken.model.encoding_name_for_model(base)
    except KeyError:
        return None
    return "o200k_base" if name.startswith("o200k") else FALLBACK_ENCODING


_LOADING = threading.Lock()


def tiktoken_encoder(name: str) -> Encode:
    """The encoding's counter, loaded once. Two first requests at once (each loading it in a
    thread) wait for one load: building an encoding takes ~0.2 s and, while it does, 40 MB for
    cl100k_base (25 MB once built), so two at once set the process's peak resident set."""
    with _LOADING:
        return _tiktoken_encoder(name)


@cache  # one per encoding name: at most two
def _tiktoken_encoder(name: str) -> Encode:
    use_bundled_encodings()
    import tiktoken

    try:
        from tiktoken_ext.openai_public import ENCODING_CONSTRUCTORS

        # Built here rather than through tiktoken's registry so that the Python copy of the
        # vocabulary can go: encoding only uses the Rust core, and the copy costs ~30 MB of RSS
        # for o200k_base (76 MB -> 48 MB measured). Nothing else holds this Encoding.
        encoding = tiktoken.Encoding(**ENCODING_CONSTRUCTORS[name]())
        encoding._mergeable_ranks = {}
    except Exception as exc:  # noqa: BLE001  # no file, no network, bad hash...: estimate, don't fail requests
        log.warning("cannot load tiktoken encoding %s (%s); estimating %d characters a token", name, exc, CHARS_PER_TOKEN)
        return _estimate
    return _counter(encoding)


def _counter(encoding: Any) -> Encode:
    """`encoding`'s count of a text ('<|endoftext|>' in it is text: encode_ordinary), short ones
    memoized (thread-safe as one dict's get and set are)."""
    encode = encoding.encode_ordinary
    short: dict[str, int] = {}

    def count(text: str) -> int:
        if len(text) > SHORT_TEXT_CHARS:
            return len(encode(text))
        tokens = short.get(text)
        if tokens is None:
            tokens = len(encode(text))
            if len(short) >= SHORT_TEXTS:
                short.clear()
            short[text] = tokens
        return tokens

    return count


def _estimate(text: str) -> int:
    return estimated_tokens(len(text))


@lru_cache(maxsize=1024)
def litellm_encoder(model: str) -> Encode:
    """litellm's counter for `model`; imports litellm (~2 s) on first use."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of the cost map
    import litellm

    return lambda text: int(litellm.token_counter(model=model, text=text))


def litellm_dir() -> Path | None:
    """litellm's package directory, found without importing litellm (its import takes seconds)."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def use_bundled_encodings() -> None:
    """Point tiktoken's cache at the encodings litellm ships, unless the user chose a cache dir.

    tiktoken names cached files by the sha1 of their URL; litellm's tokenizers directory holds
    cl100k_base (9b5ad71b...) and o200k_base (fb374d41...) under those names.
    """
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        return
    root = litellm_dir()
    bundled = root / "litellm_core_utils" / "tokenizers" if root else None
    if bundled is not None and bundled.is_dir():
        os.environ["TIKTOKEN_CACHE_DIR"] = str(bundled)


# -- context windows ----------------------------------------------------------------------------


@lru_cache(maxsize=1)  # the table is read once, on first use, and kept as {name: tokens} only
def context_windows() -> dict[str, int]:
    """model name -> max input tokens, from litellm's bundled model table (not imported: read)."""
    root = litellm_dir()
    path = root / MODEL_PRICES_FILE if root else None
    try:
        table = json.loads(path.read_bytes(), object_hook=_window_of) if path else {}
    except (OSError, ValueError) as exc:
        log.warning("cannot read litellm's model table %s: %s", path, exc)
        table = {}
    windows: dict[str, int] = {}
    for name, entry in table.items() if isinstance(table, dict) else ():
        tokens = entry[0] if isinstance(entry, tuple) else None
        if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0:
            windows[name] = tokens
    return windows


def _window_of(entry: dict[str, Any]) -> Any:
    """Each object of the model table as it is parsed: a model's entry becomes its window alone, as a
    1-tuple (JSON makes no tuples), or None without one. The whole table parsed (3.4 MB of JSON)
    left 4.9 MB resident after the 0.7 MB dict was made of it: the names kept pinned the
    allocator's arenas the rest had filled. Dropped as it is read, each entry's objects are reused
    by the next: 0.7 MB resident (measured after importing proxy.cli, malloc_trim'd)."""
    if "max_input_tokens" in entry:
        return (entry["max_input_tokens"],)
    return None if "litellm_provider" in entry else entry  # a model's entry; else the table itself, or a part of an entry


def lookup_names(model: str) -> Iterator[str]:
    """The names to try for `model`: itself, then without its provider prefixes, then the base of a
    fine-tune ('ft:gpt-4o-mini:org::id' -> 'gpt-4o-mini')."""
    name = model
    yield name
    while "/" in name:
        name = name.split("/", 1)[1]
        yield name
    if name.startswith("ft:") and name.count(":") >= 2:
        yield name.split(":")[1]
