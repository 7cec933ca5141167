"use strict";
/*
 * context-proxy /ui: the conversations, and one conversation replayed, read from the admin JSON API.
 *
 * Auth, a deliberate choice: this page (index.html, app.js, style.css) holds no data and is served
 * to anyone. Every datum comes from the admin API (/v1/conversations...) under that API's own auth:
 *   - the API always wants a Bearer (being on loopback grants nothing): the URL the proxy prints
 *     at start-up carries its admin token as `?token=`, which the page keeps and at once drops
 *     from the address bar (and its history entry); else the API answers 401 and the page asks
 *     for a token: the admin token (every tenant) or the user's own API key (only that key's
 *     conversations: any Bearer that is not the admin token is a client key). The token is kept
 *     in sessionStorage (this tab only, gone when it closes, never in a cookie, so no other site
 *     can make the browser send it: no CSRF) and sent as `Authorization: Bearer` to this origin only.
 *
 * Safety: everything shown (prompts, tool outputs, ids, model names) is untrusted text. It reaches
 * the DOM only as text nodes, textContent or setAttribute on non-URL attributes; nothing here uses
 * innerHTML or builds markup from strings, and the page's CSP (proxy/api/ui.py) forbids inline
 * script and other origins besides.
 *
 * Speed: lists and transcripts are read page by page with the API's `after` cursor and rendered as
 * each page arrives; long texts show a preview (a long tool output's full text is fetched from
 * tool_outputs/{ref} only when asked for), and off-screen messages skip layout
 * (content-visibility in style.css), so a 2,000-message conversation stays quick.
 */
(() => {
  const TOKEN_KEY = "context-proxy.ui.token";
  const API = new URL("../v1/conversations", location.href).href; // relative: works behind a path prefix
  const LIST_PAGE = 50; // conversations per request (the API allows 100)
  const MESSAGE_PAGE = 250; // trajectory messages per request (the API allows 1000)
  const TURN_PAGE = 1000;
  const AUTO_LOAD = 5000; // messages loaded without asking; then a "Load more" button
  const PREVIEW = 1500; // characters of a long text shown before "show all"
  const PREVIEW_LINES = 16; // ... or lines

  const main = document.getElementById("main");
  const authState = document.getElementById("auth-state");
  const forgetButton = document.getElementById("forget-token");

  // -- DOM, without markup strings ---------------------------------------------------------------

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "class") el.className = value;
      else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
      else el.setAttribute(key, value === true ? "" : String(value));
    }
    add(el, children);
    return el;
  }

  function add(el, ...children) {
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false || child === "") continue;
      el.append(child instanceof Node ? child : String(child)); // a string becomes a text node
    }
    return el;
  }

  const SVG = "http://www.w3.org/2000/svg";
  function s(tag, attrs, ...children) {
    const el = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value !== undefined && value !== null) el.setAttribute(key, String(value));
    }
    return add(el, children);
  }

  /** A class-name-safe word from untrusted data (a role, a status). */
  function word(value) {
    return String(value || "unknown").toLowerCase().replace(/[^a-z0-9_-]/g, "") || "unknown";
  }

  // -- formatting ---------------------------------------------------------------------------------

  const numbers = new Intl.NumberFormat("en-US");
  const num = (n) => (n === null || n === undefined || Number.isNaN(n) ? "—" : numbers.format(n));
  const pad = (n) => String(n).padStart(2, "0");

  function short(n) {
    if (n >= 1e6) return (n / 1e6).toFixed(n >= 1e7 ? 0 : 1).replace(/\.0$/, "") + "M";
    if (n >= 1e3) return (n / 1e3).toFixed(n >= 1e4 ? 0 : 1).replace(/\.0$/, "") + "k";
    return String(Math.round(n));
  }

  function when(ts) {
    if (!ts) return "—";
    const d = new Date(ts * 1000);
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }

  function ago(ts) {
    if (!ts) return "";
    const sec = Math.max(0, Date.now() / 1000 - ts);
    if (sec < 60) return `${Math.round(sec)} s ago`;
    if (sec < 3600) return `${Math.round(sec / 60)} min ago`;
    if (sec < 86400) return `${Math.round(sec / 3600)} h ago`;
    return `${Math.round(sec / 86400)} d ago`;
  }

  function timeNode(ts) {
    return h("time", { title: ago(ts) }, when(ts));
  }

  /** The text of an OpenAI message content (a string, or an array of parts), or null. */
  function textOf(content) {
    if (content === null || content === undefined) return null;
    if (typeof content === "string") return content;
    if (Array.isArray(content)) {
      return content
        .map((part) => {
          if (!part || typeof part !== "object") return String(part);
          if (part.type === "text" || part.type === "input_text" || part.type === "output_text") return part.text || "";
          if (part.type === "refusal") return part.refusal || "";
          return `[${part.type || "part"}]`;
        })
        .join("");
    }
    return JSON.stringify(content);
  }

  // Anthropic Messages blocks that need more than their text shown (the proxy stores a user
  // message's tool_result blocks one per stored message: each shows as a tool result).
  const ANTHROPIC_BLOCKS = new Set(["tool_use", "tool_result", "thinking", "redacted_thinking"]);

  /** The content blocks of an Anthropic message that holds tool use, results or thinking; else null. */
  function anthropicBlocks(message) {
    const content = message.content;
    if (!Array.isArray(content)) return null;
    return content.some((b) => b && typeof b === "object" && ANTHROPIC_BLOCKS.has(b.type)) ? content : null;
  }

  /** The tool_result block of a stored Anthropic tool result (a user message holding just it), or null. */
  function anthropicResult(message) {
    const blocks = anthropicBlocks(message);
    return blocks && blocks.length === 1 && blocks[0].type === "tool_result" ? blocks[0] : null;
  }

  /** A stored Gemini content ({role, parts}) as the Anthropic message it reads like: its text,
   * thought, functionCall and functionResponse parts as text, thinking, tool_use and tool_result
   * blocks (a call without an id is known by its name, as the proxy knows it); else the message. */
  function fromGemini(message) {
    if (!Array.isArray(message.parts) || "content" in message) return message;
    const idOf = (x) => (x && x.id) || `#${(x && x.name) || ""}`;
    const blocks = message.parts.map((p) => {
      if (!p || typeof p !== "object") return { type: "text", text: String(p) };
      if (typeof p.text === "string") return p.thought ? { type: "thinking", thinking: p.text } : { type: "text", text: p.text };
      if (p.functionCall) return { type: "tool_use", id: idOf(p.functionCall), name: p.functionCall.name, input: p.functionCall.args || {} };
      if (p.functionResponse) {
        const r = p.functionResponse.response || {};
        const keys = Object.keys(r);
        const text = keys.length === 1 && typeof r[keys[0]] === "string" ? r[keys[0]] : JSON.stringify(r);
        return { type: "tool_result", tool_use_id: idOf(p.functionResponse), content: text };
      }
      return { type: Object.keys(p)[0] || "part" };
    });
    return { ...message, role: message.role === "model" ? "assistant" : message.role || "user", content: blocks };
  }

  /** Characters of a message as the transcript holds it: content plus tool calls. */
  function charsOf(message) {
    message = fromGemini(message);
    if (typeof message.type === "string") return responsesChars(message);
    const blocks = anthropicBlocks(message);
    if (blocks) {
      let n = 0;
      for (const b of blocks) {
        if (b.type === "text") n += (b.text || "").length;
        else if (b.type === "thinking") n += (b.thinking || "").length;
        else if (b.type === "tool_use") n += (b.name || "").length + JSON.stringify(b.input || {}).length;
        else if (b.type === "tool_result") n += (textOf(b.content) || "").length;
      }
      return n;
    }
    let n = (textOf(message.content) || "").length;
    for (const call of message.tool_calls || []) {
      const fn = call.function || {};
      n += (fn.name || "").length + (fn.arguments || "").length;
    }
    return n;
  }

  // -- auth and the API ---------------------------------------------------------------------------

  const auth = {
    get() {
      try {
        return sessionStorage.getItem(TOKEN_KEY);
      } catch {
        return null;
      }
    },
    set(token) {
      sessionStorage.setItem(TOKEN_KEY, token);
    },
    clear() {
      sessionStorage.removeItem(TOKEN_KEY);
    },
  };

  function showAuthState() {
    const token = auth.get();
    authState.textContent = token ? "Signed in with a token" : "";
    forgetButton.hidden = !token;
  }

  forgetButton.addEventListener("click", () => {
    auth.clear();
    route();
  });

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  /** GET an admin API path (under /v1/conversations) as JSON, with the Bearer if one is kept. */
  async function api(path, params, signal) {
    const url = new URL(API + path);
    for (const [key, value] of Object.entries(params || {})) {
      if (value !== undefined && value !== null && value !== "") url.searchParams.set(key, value);
    }
    const headers = { Accept: "application/json" };
    const token = auth.get();
    if (token) headers.Authorization = `Bearer ${token}`;
    let response;
    try {
      response = await fetch(url, { headers, signal, cache: "no-store", credentials: "omit" });
    } catch (err) {
      if (err.name === "AbortError") throw err;
      throw new ApiError(0, `The proxy did not answer (${err.message})`);
    }
    let body = null;
    try {
      body = await response.json();
    } catch {
      /* not JSON: keep the status */
    }
    if (!response.ok) {
      const message = body && body.error && body.error.message;
      throw new ApiError(response.status, message || response.statusText || `HTTP ${response.status}`);
    }
    return body;
  }

  function conversationPath(id) {
    return "/" + encodeURIComponent(id);
  }

  function conversationHref(id, tenant) {
    return "#/c/" + encodeURIComponent(id) + (tenant ? "?tenant=" + encodeURIComponent(tenant) : "");
  }

  // -- routing ------------------------------------------------------------------------------------

  let current = null; // the AbortController of the view on screen

  function route() {
    if (current) current.abort();
    current = new AbortController();
    const signal = current.signal;
    showAuthState();
    const hash = location.hash.replace(/^#/, "");
    const [path, query] = [hash.split("?")[0], hash.split("?").slice(1).join("?")];
    const parts = path.split("/").filter(Boolean);
    let view;
    if (parts[0] === "c" && parts[1]) {
      const tenant = new URLSearchParams(query).get("tenant") || "";
      view = showConversation(decodeURIComponent(parts[1]), tenant, signal);
    } else if (parts[0] === "knowledge") {
      view = showKnowledge(parts[1] ? decodeURIComponent(parts[1]) : null, new URLSearchParams(query).get("tenant") || "", signal);
    } else {
      view = showList(signal, new URLSearchParams(query));
    }
    view.catch((err) => showFailure(err, signal));
  }

  function showFailure(err, signal) {
    if (signal.aborted || (err && err.name === "AbortError")) return;
    if (err instanceof ApiError && err.status === 401) {
      showTokenPrompt(err);
      return;
    }
    main.replaceChildren(
      h(
        "div",
        { class: "card error", role: "alert" },
        h("h1", null, "Could not load"),
        h("p", null, err instanceof ApiError && err.status ? `HTTP ${err.status}: ` : "", String(err.message || err)),
        h("p", null, h("a", { href: "#/" }, "Back to the conversations"))
      )
    );
  }

  function showTokenPrompt(err) {
    document.title = "Token needed · context-proxy";
    const hadToken = Boolean(auth.get());
    if (hadToken) auth.clear(); // refused: forget it
    showAuthState();
    const input = h("input", {
      id: "token-input",
      type: "password",
      name: "token",
      autocomplete: "off",
      spellcheck: "false",
      placeholder: "admin token, or your API key",
      required: true,
    });
    const form = h(
      "form",
      {
        id: "token-form",
        class: "card token-form",
        onsubmit: (event) => {
          event.preventDefault();
          const token = input.value.trim();
          if (!token) return;
          auth.set(token);
          route();
        },
      },
      h("h1", null, "This proxy needs a token"),
      h("p", { class: "api-answer" }, "The admin API answered ", h("code", null, String(err.status)), ": ", err.message),
      h(
        "p",
        null,
        "Enter the proxy's admin token to see every conversation, or your own API key to see only yours. ",
        "It is kept in this tab's session storage and sent only to this proxy, as ",
        h("code", null, "Authorization: Bearer"),
        "."
      ),
      h("label", { for: "token-input" }, "Token"),
      h("div", { class: "row" }, input, h("button", { type: "submit", id: "token-submit" }, "Continue"))
    );
    main.replaceChildren(form);
    input.focus();
  }

  // -- the conversations list ---------------------------------------------------------------------
  // Searched and filtered by the server (`q`, `failed`: see proxy/api/admin.py), page by page with
  // the `after` cursor; the search and the filter live in the URL (#/?q=...&failed=1).

  const SEARCH_DELAY_MS = 250; // after the last keystroke, before asking the server
  const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

  /** "Dec 1 13:45": short enough for a column; the exact time is in the title. */
  function shortWhen(ts) {
    if (!ts) return "—";
    const d = new Date(ts * 1000);
    return `${MONTHS[d.getMonth()]} ${d.getDate()} ${pad(d.getHours())}:${pad(d.getMinutes())}`;
  }

  function listHash(q, failed) {
    const params = new URLSearchParams();
    if (q) params.set("q", q);
    if (failed) params.set("failed", "1");
    const query = params.toString();
    return "#/" + (query ? "?" + query : "");
  }

  async function showList(signal, params) {
    document.title = "Conversations · context-proxy";
    let rows = 0;
    let after = null;
    let hasMore = false;
    let load = null; // the AbortController of the page being fetched
    let timer = null;

    const search = h("input", {
      id: "search",
      type: "search",
      placeholder: "Search titles, tasks, models, clients, ids…",
      autocomplete: "off",
      "aria-label": "Search conversations",
      value: params.get("q") || "",
    });
    const failedOnly = h("input", { id: "failed-only", type: "checkbox", checked: params.get("failed") === "1" });
    const count = h("span", { id: "list-count", class: "muted" });
    const more = h("button", { id: "load-more", type: "button", hidden: true }, "Load more");
    const problem = h("p", { class: "error", role: "alert", hidden: true });
    const empty = h("p", { id: "list-empty", class: "muted", hidden: true });
    const tbody = h("tbody");
    const headings = [
      ["Conversation", "Its title (X-Conversation-Title, or set in the API), else its task's first words; its id and tenant", "title-col"],
      ["Client", "From the User-Agent of its newest turn", "client-col"],
      ["Model", "Of its newest turn", "model-col"],
      ["Turns", "Turns the proxy recorded", "num-col"],
      ["Messages", "Live messages (the transcript as it stands)", "num-col"],
      ["LLM calls", "Upstream calls made for it: what the quota counts", "num-col"],
      ["Compaction", "The summary in use and where its boundary is", "compaction-col"],
      ["Failures", "Turns that failed, with the newest error", "num-col"],
      ["Last activity", "", "time-col"],
    ];
    const table = h(
      "table",
      { id: "conversations", class: "grid conversations" },
      h("thead", null, h("tr", null, headings.map(([label, title, cls]) => h("th", { scope: "col", title: title || null, class: cls }, label)))),
      tbody
    );
    const note = auth.get()
      ? h(
          "p",
          { class: "muted small" },
          "With a token: the admin token shows every tenant; any other token counts as an API key and shows only that key's conversations."
        )
      : null;
    main.replaceChildren(
      h(
        "section",
        { class: "list" },
        h(
          "div",
          { class: "toolbar" },
          h("h1", null, "Conversations"),
          search,
          h("label", { class: "check", for: "failed-only" }, failedOnly, "Only with failures"),
          count,
          h("span", { class: "spacer" }),
          h("button", { type: "button", onclick: () => route() }, "Refresh")
        ),
        note,
        h("div", { class: "table-wrap" }, table),
        empty,
        problem,
        h("div", { class: "pager" }, more)
      )
    );

    function describe() {
      const q = search.value.trim();
      const what = q || failedOnly.checked ? (rows === 1 ? "match" : "matches") : "loaded";
      count.textContent = `${num(rows)} ${what}${hasMore ? ", more on the server" : ""}`;
      empty.hidden = rows > 0;
      if (!q && !failedOnly.checked) empty.textContent = "No conversations yet: they appear here after their first request.";
      else empty.textContent = hasMore ? "None found so far: load more to search further back." : "No conversation matches.";
    }

    /** One page from the server, after the cursor (`fresh`: the first page of a new search). */
    async function loadPage(fresh) {
      if (load) load.abort();
      const controller = (load = new AbortController());
      signal.addEventListener("abort", () => controller.abort(), { once: true });
      const q = search.value.trim();
      const query = { limit: LIST_PAGE, after: fresh ? null : after, q, failed: failedOnly.checked ? "true" : null };
      const page = await api("", query, controller.signal);
      if (controller.signal.aborted) return;
      if (fresh) {
        tbody.replaceChildren();
        rows = 0;
      }
      for (const c of page.data) tbody.append(conversationRow(c));
      rows += page.data.length;
      hasMore = Boolean(page.has_more);
      after = page.next_after || page.last_id || after; // a search says where its scan stopped
      more.hidden = !hasMore;
      table.dataset.loaded = String(rows);
      table.dataset.query = q;
      describe();
    }

    async function guarded(fresh) {
      problem.hidden = true;
      try {
        await loadPage(fresh);
      } catch (err) {
        if (err.name === "AbortError" || signal.aborted) return;
        if (err instanceof ApiError && err.status === 401) return showTokenPrompt(err);
        problem.textContent = `Could not load: ${err.message}`;
        problem.hidden = false;
      }
    }

    function changed() {
      history.replaceState(null, "", listHash(search.value.trim(), failedOnly.checked));
      clearTimeout(timer);
      timer = setTimeout(() => guarded(true), SEARCH_DELAY_MS);
    }

    search.addEventListener("input", changed);
    failedOnly.addEventListener("change", changed);
    signal.addEventListener("abort", () => clearTimeout(timer), { once: true });
    more.addEventListener("click", async () => {
      more.disabled = true;
      try {
        await guarded(false);
      } finally {
        more.disabled = false;
      }
    });
    await loadPage(true);
    search.focus();
  }

  function conversationRow(c) {
    const compaction = c.summary_id ? `#${c.summary_id} · seq ${num(c.boundary)}` : c.boundary ? `seq ${num(c.boundary)}` : "none";
    let calls = num(c.llm_calls);
    if (c.quota && c.quota.limit) calls += ` of ${num(c.quota.limit)}`;
    const title = c.title || c.id;
    const error = c.last_error;
    const failures = c.failures
      ? h(
          "span",
          { class: "badge status-failed", title: error ? `Turn ${error.turn}: ${failureText(error)}` : null },
          `${num(c.failures)} failed`
        )
      : "—";
    return h(
      "tr",
      { class: `conversation${c.failures ? " has-failures" : ""}`, "data-id": c.id, "data-tenant": c.tenant || "" },
      h(
        "td",
        { class: "title-col" },
        h("a", { class: "title", href: conversationHref(c.id, c.tenant), title }, title),
        h("div", { class: "sub" }, h("code", { class: "conv-id", title: c.id }, c.id), c.tenant ? h("code", { class: "tenant", title: "tenant" }, c.tenant) : null),
        threadOf(c)
      ),
      h("td", { class: "client-col", title: c.client || null }, h("span", { class: "clamp" }, c.client || "—")),
      h("td", { class: "model-col", title: c.model || null }, c.model ? h("code", { class: "clamp" }, c.model) : "—"),
      h("td", { class: "num" }, num(c.turns)),
      h("td", { class: "num" }, num(c.message_count)),
      h("td", { class: "num" }, calls),
      h("td", { class: "compaction-col", title: c.summary_id ? `summary #${c.summary_id}, boundary at seq ${c.boundary}` : null }, compaction),
      h("td", { class: "num" }, failures),
      h("td", { class: "time-col" }, h("time", { title: `${when(c.updated_at)} (${ago(c.updated_at)}); created ${when(c.created_at)}` }, shortWhen(c.updated_at)))
    );
  }

  /** A failed turn's error, for people: "500 from the upstream: upstream broke". */
  function failureText(error) {
    if (error.source === "client") return error.message || "the client went away"; // its message says who
    const by = { upstream: "the upstream", proxy: "the proxy" }[error.source] || error.source || "?";
    return `${error.status ? `${error.status} from ` : ""}${by}: ${error.message || "no message"}`;
  }

  // -- one conversation, replayed -----------------------------------------------------------------

  const STATUS_NOTES = {
    compacted: "Behind the compaction boundary: it goes upstream as the summary, no longer verbatim.",
    superseded: "The client edited or regenerated from here: no longer in the live transcript.",
    failed: "The upstream refused or failed this turn: never part of the live transcript.",
    incomplete: "The client left before the reply finished: a partial reply.",
    internal: "The proxy's own read-back round (read_tool_output): never shown to the client.",
    pending: "Written before forwarding; the reply has not completed yet.",
  };

  async function loadTurns(base, query, signal) {
    const turns = [];
    let after = 0;
    for (;;) {
      const page = await api(base + "/turns", { ...query, limit: TURN_PAGE, after }, signal);
      turns.push(...page.data);
      if (!page.has_more || !page.data.length) return turns;
      after = page.last_id;
    }
  }

  async function showConversation(id, tenant, signal) {
    document.title = `${id} · context-proxy`;
    const base = conversationPath(id);
    const query = tenant ? { tenant } : {};
    main.replaceChildren(h("p", { class: "muted" }, "Loading the conversation…"));
    const turnsLoad = loadTurns(base, query, signal).catch((err) => {
      if (err instanceof ApiError && err.status !== 401) return null; // shown as "no turn records"
      throw err;
    });
    const [conversation, turns] = await Promise.all([api(base, query, signal), turnsLoad]);
    const view = new Replay(conversation, turns || [], base, query, signal);
    if (turns === null) view.noTurns();
    main.replaceChildren(view.root);
    const inbox = inboxPanel(base, query, signal);
    view.cards.after(inbox, historySearchPanel(base, query, signal), knowledgeCard(conversation, turns || []) || "");
    const inboxLoad = inbox.refresh();

    let after = null;
    let limit = AUTO_LOAD;
    for (;;) {
      const page = await api(base + "/trajectory", { ...query, limit: MESSAGE_PAGE, after }, signal);
      if (after === null) {
        view.setSummaries(page.summaries || []);
        const request = requestPartsCard(conversation, page.request_parts || []);
        if (request) view.cards.after(request);
      }
      view.renderPage(page.data);
      after = page.last_id || after;
      if (!page.has_more || !page.data.length) break;
      if (view.loaded >= limit) {
        await view.askForMore();
        limit += AUTO_LOAD;
      }
    }
    markInboxDeliveries(view, await inboxLoad);
    view.finish(); // last: #timeline[data-complete] says the replay is drawn, inbox deliveries too
  }

  class Replay {
    constructor(conversation, turns, base, query, signal) {
      this.conversation = conversation;
      this.turns = turns.slice().sort((a, b) => a.turn - b.turn);
      this.base = base;
      this.query = query;
      this.signal = signal;
      this.loaded = 0;
      this.lastSeq = 0;
      this.nodes = new Map(); // seq -> li, for the window highlight
      this.callNames = new Map(); // tool_call_id -> function name
      this.counted = []; // [seq, chars] of live and compacted messages, in seq order: the stored estimate
      this.markers = []; // {pos, node()} sorted: summaries after their last_seq, turns before their reply
      this.nextMarker = 0;
      this.branch = null; // the superseded branch being filled
      this.summaries = [];
      this.activeTurn = null;
      this.format = this.turns.length ? this.turns[0].format : null; // the wire format its items are in

      for (const turn of this.turns) {
        const sent = turn.sent_seqs || [];
        const pos = turn.reply_seq ? turn.reply_seq - 0.3 : (sent.length ? Math.max(...sent) : 0) + 0.6;
        this.markers.push({ pos, kind: "turn", make: () => this.turnNode(turn) });
      }
      this.markers.sort((a, b) => a.pos - b.pos);
      this.build();
    }

    build() {
      const c = this.conversation;
      this.timeline = h("ol", { id: "timeline", class: "timeline" });
      this.progress = h("span", { id: "progress", class: "muted" }, "Loading messages…");
      this.moreButton = h("button", { id: "load-more-messages", type: "button", hidden: true }, "Load more messages");
      this.cards = h("div", { class: "cards" });
      this.tokenChart = h("div", { class: "chart", id: "token-chart" });
      this.quotaChart = h("div", { class: "chart", id: "quota-chart" });
      this.turnNote = h("p", { class: "muted small", hidden: true });
      const compaction = c.summary_id ? `summary #${c.summary_id}, boundary at seq ${num(c.boundary)}` : "none yet";
      this.root = h(
        "section",
        { class: "conversation-view", "data-id": c.id },
        h("p", { class: "crumbs" }, h("a", { href: "#/" }, "← Conversations")),
        conversationHeading(c),
        h(
          "dl",
          { class: "meta" },
          [
            ["Tenant", h("code", null, c.tenant || "—")],
            ["Created", timeNode(c.created_at)],
            ["Last activity", timeNode(c.updated_at)],
            ["Live messages", num(c.message_count)],
            ["LLM calls", num(c.llm_calls)],
            ["Compaction", compaction],
            ...conversationFacts(c),
          ].map(([term, value]) => h("div", null, h("dt", null, term), h("dd", null, value)))
        ),
        this.cards,
        h(
          "section",
          { class: "charts" },
          h("h2", null, "Tokens per turn"),
          this.tokenChart,
          h(
            "ul",
            { class: "legend" },
            h(
              "li",
              null,
              h("span", { class: "swatch sent" }),
              "Tokens sent upstream, our count: the turn's window after truncation, compaction and trimming, every call of the turn (read-back rounds too)."
            ),
            h(
              "li",
              null,
              h("span", { class: "swatch reported" }),
              "Input tokens the upstream reported (its usage, every call of the turn): its own tokenizer's count, cache reads included."
            ),
            h("li", null, h("span", { class: "swatch failed" }), "A failed or incomplete turn: its error is in the bar's tooltip and in the replay."),
            h(
              "li",
              null,
              h("span", { class: "swatch stored" }),
              "Transcript stored, estimated: characters ÷ 4 of the live transcript (compacted messages included) up to the turn's reply — an estimate, not a tokenizer count."
            )
          ),
          h("h2", null, "Quota: LLM calls used"),
          this.quotaChart,
          this.turnNote
        ),
        h(
          "div",
          { class: "timeline-head" },
          h("h2", null, "Replay"),
          h(
            "ul",
            { class: "status-legend" },
            Object.entries(STATUS_NOTES).map(([status, note]) => h("li", { class: `badge status-${status}`, title: note }, status))
          )
        ),
        this.timeline,
        h("div", { class: "pager" }, this.progress, this.moreButton)
      );
      this.updateStats();
    }

    noTurns() {
      this.turnNote.textContent = "This proxy keeps no turn records for this conversation.";
      this.turnNote.hidden = false;
    }

    setSummaries(summaries) {
      this.summaries = summaries;
      for (const summary of summaries) {
        this.markers.push({ pos: summary.last_seq + 0.3, kind: "summary", make: () => this.summaryNode(summary) });
      }
      this.markers.sort((a, b) => a.pos - b.pos);
    }

    askForMore() {
      this.moreButton.hidden = false;
      return new Promise((resolve) => {
        this.moreButton.addEventListener(
          "click",
          () => {
            this.moreButton.hidden = true;
            resolve();
          },
          { once: true }
        );
      });
    }

    renderPage(messages) {
      if (this.signal.aborted) return;
      for (const message of messages) {
        this.flushMarkers(message.seq, message.status);
        this.place(this.messageNode(message), message.status);
        const status = message.status || "live";
        if (status === "live" || status === "compacted") this.counted.push([message.seq, charsOf(message)]);
        this.lastSeq = message.seq;
      }
      this.loaded += messages.length;
      this.progress.textContent = `${num(this.loaded)} messages loaded…`;
      this.updateStats();
    }

    finish() {
      this.flushMarkers(Infinity, null);
      this.complete = true;
      this.progress.textContent = `${num(this.loaded)} messages, ${num(this.summaries.length)} summaries, ${num(this.turns.length)} turns.`;
      this.timeline.dataset.complete = "true";
      this.updateStats();
    }

    /** Markers placed before `seq`: into the open superseded branch when the next message continues it. */
    flushMarkers(seq, nextStatus) {
      while (this.nextMarker < this.markers.length && this.markers[this.nextMarker].pos < seq) {
        const marker = this.markers[this.nextMarker++];
        const node = marker.make();
        if (marker.kind === "turn" && this.branch && nextStatus === "superseded") this.branch.body.append(node);
        else {
          this.branch = null;
          this.timeline.append(node);
        }
      }
    }

    place(node, status) {
      if (status !== "superseded") {
        this.branch = null;
        this.timeline.append(node);
        return;
      }
      if (!this.branch) {
        const label = h("span");
        const body = h("ol", { class: "branch-body" });
        const details = h(
          "details",
          { class: "branch" },
          h("summary", { title: STATUS_NOTES.superseded }, label),
          body
        );
        this.timeline.append(h("li", { class: "branch-item" }, details));
        this.branch = { label, body, first: null, last: null, count: 0 };
      }
      const branch = this.branch;
      const seq = Number(node.dataset.seq);
      branch.first = branch.first ?? seq;
      branch.last = seq;
      branch.count += 1;
      branch.label.textContent = `Superseded branch · ${num(branch.count)} message${branch.count === 1 ? "" : "s"} (seq ${branch.first}–${branch.last}) — the client edited or regenerated`;
      branch.body.append(node);
    }

    messageNode(m) {
      if (isResponsesItem(m, this.format)) return responsesItemNode(this, m);
      m = fromGemini(m);
      const result = anthropicResult(m);
      if (result) return this.anthropicResultNode(m, result);
      const role = m.role || "unknown";
      const status = m.status || "live";
      const li = h("li", {
        class: `message role-${word(role)} status-${word(status)}`,
        "data-seq": m.seq,
        "data-role": word(role),
        "data-status": word(status),
      });
      const head = h(
        "div",
        { class: "message-head" },
        h("span", { class: "seq" }, `#${m.seq}`),
        h("span", { class: "role" }, role),
        m.name ? h("span", { class: "name" }, m.name) : null,
        status !== "live" ? h("span", { class: `badge status-${word(status)}`, title: STATUS_NOTES[status] || null }, status) : null
      );
      li.append(head);
      if (role === "tool") {
        const name = this.callNames.get(m.tool_call_id);
        const length = (textOf(m.content) || "").length;
        add(
          head,
          h("span", { class: "tool-of" }, "result of ", h("code", null, name || "?"), " ", h("span", { class: "muted" }, m.tool_call_id || "")),
          h("span", { class: "muted chars" }, `${num(length)} chars`)
        );
      }
      head.append(h("span", { class: "spacer" }), timeNode(m.created_at));

      const blocks = anthropicBlocks(m);
      if (blocks) {
        for (const block of blocks) li.append(this.blockNode(block));
        this.nodes.set(m.seq, li);
        return li;
      }
      const text = textOf(m.content);
      if (role === "tool") {
        li.append(this.toolOutput(m, text || ""));
      } else if (text !== null && text !== "") {
        li.append(clipped(text, "content"));
      }
      if (m.refusal) li.append(clipped(String(m.refusal), "content refusal"));
      for (const call of m.tool_calls || []) {
        const fn = call.function || {};
        this.callNames.set(call.id, fn.name);
        li.append(this.toolCallNode(call));
      }
      this.nodes.set(m.seq, li);
      return li;
    }

    /** One Anthropic content block: text, thinking, a tool call, a tool result, or its type. */
    blockNode(block) {
      if (!block || typeof block !== "object") return clipped(String(block), "content");
      switch (block.type) {
        case "text":
          return clipped(block.text || "", "content");
        case "thinking":
        case "redacted_thinking": {
          const shown = block.type === "thinking" && block.thinking;
          const note = block.type === "redacted_thinking" ? "redacted thinking (encrypted)" : shown ? "thinking" : "thinking (not shown; signed)";
          return h(
            "details",
            { class: "thinking", "data-block": block.type },
            h("summary", null, note, shown ? ` · ${num(block.thinking.length)} chars` : null),
            shown ? clipped(block.thinking, "content") : null
          );
        }
        case "tool_use":
          this.callNames.set(block.id, block.name);
          return this.toolCallNode({ id: block.id, function: { name: block.name, arguments: JSON.stringify(block.input || {}) } });
        case "tool_result": {
          const text = textOf(block.content) || "";
          return h("div", { class: "tool-output" }, h("span", { class: "muted" }, `result of ${this.callNames.get(block.tool_use_id) || "?"}`), clipped(text, "content"));
        }
        default:
          return h("div", { class: "muted block-type" }, `[${block.type || "block"}]`);
      }
    }

    /** A stored Anthropic tool result, shown as a tool message: its call's name, its output expandable. */
    anthropicResultNode(m, result) {
      const status = m.status || "live";
      const text = textOf(result.content) || "";
      const li = h("li", {
        class: `message role-tool status-${word(status)}`,
        "data-seq": m.seq,
        "data-role": "tool",
        "data-status": word(status),
      });
      li.append(
        h(
          "div",
          { class: "message-head" },
          h("span", { class: "seq" }, `#${m.seq}`),
          h("span", { class: "role" }, "tool"),
          status !== "live" ? h("span", { class: `badge status-${word(status)}`, title: STATUS_NOTES[status] || null }, status) : null,
          h(
            "span",
            { class: "tool-of" },
            "result of ",
            h("code", null, this.callNames.get(result.tool_use_id) || "?"),
            " ",
            h("span", { class: "muted" }, result.tool_use_id || "")
          ),
          result.is_error ? h("span", { class: "badge status-failed" }, "error") : null,
          h("span", { class: "muted chars" }, `${num(text.length)} chars`),
          h("span", { class: "spacer" }),
          timeNode(m.created_at)
        ),
        this.toolOutput(m, text)
      );
      this.nodes.set(m.seq, li);
      return li;
    }

    toolCallNode(call) {
      const fn = call.function || {};
      let args = fn.arguments === undefined || fn.arguments === null ? "" : String(fn.arguments);
      try {
        args = JSON.stringify(JSON.parse(args), null, 2);
      } catch {
        /* not JSON: shown as sent */
      }
      return h(
        "div",
        { class: "tool-call", "data-call-id": call.id || "" },
        h(
          "div",
          { class: "tool-call-head" },
          h("span", { class: "label" }, "tool call"),
          h("code", { class: "fn" }, fn.name || "?"),
          h("span", { class: "muted" }, call.id || "")
        ),
        clipped(args, "arguments")
      );
    }

    /** A tool output: whole if short, else a preview and a button that fetches tool_outputs/{ref}. */
    toolOutput(m, text) {
      const preview = previewOf(text);
      if (preview === null || !m.ref) return h("div", { class: "tool-output" }, clipped(text, "content"));
      const ref = m.ref;
      const path = `${this.base}/tool_outputs/${encodeURIComponent(ref)}`;
      const load = async () => (await api(path, this.query, this.signal)).content;
      return h(
        "div",
        { class: "tool-output long", "data-ref": ref },
        expandable(preview, text.length, load, "content", `Show full output (${num(text.length)} chars)`)
      );
    }

    summaryNode(summary) {
      const current = summary.id === this.conversation.summary_id;
      return h(
        "li",
        { class: `summary${current ? " current" : ""}`, "data-summary-id": summary.id, "data-last-seq": summary.last_seq },
        h("div", { class: "boundary" }, h("span", null, `Compaction boundary after seq ${summary.last_seq}`)),
        h(
          "div",
          { class: "summary-head" },
          h("strong", null, `Summary #${summary.id}`),
          h("span", null, `covers seq ${summary.first_seq}–${summary.last_seq}`),
          h("span", null, summary.strategy),
          h("span", null, summary.model),
          h("span", null, `summarizer: ${num(summary.tokens_in)} tokens in, ${num(summary.tokens_out)} out`),
          current ? h("span", { class: "badge current" }, "in use") : h("span", { class: "badge" }, "replaced by a later summary"),
          h("span", { class: "spacer" }),
          timeNode(summary.created_at)
        ),
        clipped(summary.text || "", "content")
      );
    }

    turnNode(turn) {
      const sent = turn.sent_seqs || [];
      const button = h("button", { type: "button", class: "link-button window-toggle", "aria-pressed": "false" }, "show window");
      const li = h(
        "li",
        { class: `turn${turn.error ? " failed" : ""}`, "data-turn": turn.turn },
        h("span", { class: "turn-label" }, `Turn ${turn.turn}`),
        h("span", null, "→ ", h("code", null, turn.model || "?")),
        h("strong", { class: "tokens-sent" }, `${num(turn.tokens_sent)} tokens sent`),
        h("span", null, `${num(sent.length)} messages in the window`),
        turn.messages_left_out ? h("span", null, `${num(turn.messages_left_out)} left out`) : null,
        turn.summary_id ? h("span", null, `with summary #${turn.summary_id}`) : null,
        turn.truncated ? h("span", null, `${num(turn.truncated)} output${turn.truncated === 1 ? "" : "s"} shortened`) : null,
        turn.read_rounds ? h("span", null, `${num(turn.read_rounds)} read-back round${turn.read_rounds === 1 ? "" : "s"}`) : null,
        turn.repairs ? h("span", null, `${num(turn.repairs)} pairing repair${turn.repairs === 1 ? "" : "s"}`) : null,
        turn.llm_calls !== undefined && turn.llm_calls !== null ? h("span", { class: "quota" }, `quota: ${num(turn.llm_calls)} LLM calls used`) : null,
        button,
        turnFailure(turn)
      );
      button.addEventListener("click", () => this.toggleWindow(turn, li, button));
      return li;
    }

    /** Highlight the messages this turn sent upstream; dim the ones it left out. */
    toggleWindow(turn, li, button) {
      const wasActive = this.activeTurn === turn.turn;
      this.timeline.classList.remove("window-mode");
      for (const node of this.timeline.querySelectorAll(".in-window")) node.classList.remove("in-window");
      for (const node of this.timeline.querySelectorAll(".turn.active")) node.classList.remove("active");
      for (const other of this.timeline.querySelectorAll(".window-toggle[aria-pressed='true']")) {
        other.setAttribute("aria-pressed", "false");
        other.textContent = "show window";
      }
      this.activeTurn = null;
      if (wasActive) return;
      this.activeTurn = turn.turn;
      this.timeline.classList.add("window-mode");
      li.classList.add("active");
      button.setAttribute("aria-pressed", "true");
      button.textContent = "hide window";
      for (const seq of turn.sent_seqs || []) {
        const node = this.nodes.get(seq);
        if (node) node.classList.add("in-window");
      }
    }

    /** Stored-token estimate (chars/4 of the counted transcript) at each turn's reply, if loaded yet. */
    points() {
      const anchors = this.turns.map((t) => t.reply_seq || Math.max(0, ...(t.sent_seqs || [])));
      const order = anchors.map((_, i) => i).sort((a, b) => anchors[a] - anchors[b]);
      const stored = new Array(this.turns.length).fill(null);
      let chars = 0;
      let j = 0;
      for (const i of order) {
        while (j < this.counted.length && this.counted[j][0] <= anchors[i]) chars += this.counted[j++][1];
        if (anchors[i] <= this.lastSeq || this.complete) stored[i] = Math.round(chars / 4);
      }
      return this.turns.map((t, i) => ({ turn: t.turn, stored: stored[i], calls: t.llm_calls, ...turnFigures(t) }));
    }

    updateStats() {
      const points = this.points();
      const last = points[points.length - 1];
      const cards = [
        ["Turns", num(this.turns.length)],
        ["Tokens sent, last turn", last ? num(last.sent) : "—"],
        ["Transcript stored (est.)", last && last.stored !== null ? `~${num(last.stored)}` : "—"],
        [
          "Sent / stored, last turn",
          last && last.stored && last.sent !== null && last.sent !== undefined ? `${Math.round((100 * last.sent) / last.stored)}%` : "—",
        ],
        ["Summaries", num(this.summaries.length)],
        ["LLM calls", num(this.conversation.llm_calls)],
      ];
      this.cards.replaceChildren(
        ...cards.map(([label, value]) => h("div", { class: "stat" }, h("div", { class: "value" }, value), h("div", { class: "label" }, label)))
      );
      this.tokenChart.replaceChildren(tokenChart(points));
      this.quotaChart.replaceChildren(quotaChart(points));
    }
  }

  /** A thread of a client session other than its main one (a subagent's): a link to the main thread. */
  function threadOf(c) {
    if (!c.family || c.family === c.id) return null;
    return h(
      "div",
      { class: "thread-of sub" },
      "thread of session ",
      h("a", { href: conversationHref(c.family, c.tenant), title: "the session's main thread" }, h("code", null, c.family))
    );
  }

  // -- failures, titles and the upstream's own count (issue 17) ------------------------------------

  /** The conversation's title (its own, or its task's first words) with its id beneath. */
  function conversationHeading(c) {
    const title = c.title || c.id;
    return h(
      "h1",
      { class: "conversation-title" },
      h("span", { class: "title" }, title),
      title !== c.id ? h("span", { class: "conv-id small" }, c.id) : null
    );
  }

  /** Client, model and failures, for the conversation's facts. */
  function conversationFacts(c) {
    const facts = [
      ["Client", c.client || "—"],
      ["Model", c.model ? h("code", null, c.model) : "—"],
      ["Turns", num(c.turns)],
    ];
    if (c.failures) {
      const error = c.last_error;
      facts.push([
        "Failures",
        h("span", { class: "badge status-failed", title: error ? failureText(error) : null }, `${num(c.failures)} failed`),
      ]);
    }
    if (c.task && c.task !== c.title) facts.push(["Task", h("span", { class: "task" }, c.task)]);
    if (c.family && c.family !== c.id) {
      facts.push(["Session", h("span", null, "a thread of ", h("a", { href: conversationHref(c.family, c.tenant) }, h("code", null, c.family)))]);
    } else if (c.family) {
      facts.push(["Session", h("span", null, "the main thread of its client's session (its other threads: ", h("code", null, `${c.id}:…`), ")")]);
    }
    return facts;
  }

  /** A failed or incomplete turn's error under its marker in the replay; null for a turn that went well. */
  function turnFailure(turn) {
    const error = turn.error;
    if (!error) return null;
    const label = turn.status === "failed" ? "Failed" : "Incomplete";
    return h(
      "div",
      { class: "turn-error", role: "note" },
      h("span", { class: `badge status-${turn.status === "failed" ? "failed" : "incomplete"}` }, label),
      h("span", { class: "error-text" }, failureText(error))
    );
  }

  /** A turn record's figures for the chart: tokens sent by our count (every call of the turn), the
   * upstream's own count when it reported usage, and the turn's error. */
  function turnFigures(t) {
    const usage = t.usage || null;
    return {
      sent: t.tokens_sent_total ?? t.tokens_sent,
      reported: usage ? usage.input_tokens : null,
      cached: usage ? usage.cache_read_input_tokens : null,
      error: t.error || null,
      status: t.status,
    };
  }

  function reportedNote(p) {
    let note = "";
    if (p.reported !== null && p.reported !== undefined) {
      note += `; the upstream counted ${num(p.reported)} input tokens`;
      if (p.cached) note += ` (${num(p.cached)} from its cache)`;
    }
    if (p.error) note += `\n${p.status === "failed" ? "Failed" : "Incomplete"}: ${failureText(p.error)}`;
    return note;
  }

  /** A red band behind each failed or incomplete turn, its error as the tooltip. */
  function failureBands(svg, points, { slot, margin, plotH }) {
    points.forEach((p, i) => {
      if (!p.error) return;
      svg.append(
        s(
          "rect",
          { x: margin.left + slot * i, y: margin.top, width: slot, height: plotH, class: "failed-band", "data-turn": p.turn },
          s("title", null, `Turn ${p.turn} ${p.status === "failed" ? "failed" : "is incomplete"}: ${failureText(p.error)}`)
        )
      );
    });
  }

  /** A tick at the input tokens the upstream reported for each turn. */
  function reportedTicks(svg, points, { slot, y, left }) {
    points.forEach((p, i) => {
      if (p.reported === null || p.reported === undefined) return;
      const half = Math.min(Math.max(slot * 0.45, 2), 30);
      const x = left + slot * (i + 0.5);
      svg.append(
        s(
          "line",
          { x1: x - half, x2: x + half, y1: y(p.reported), y2: y(p.reported), class: "tick-reported" },
          s("title", null, `Turn ${p.turn}: the upstream counted ${num(p.reported)} input tokens${p.cached ? `, ${num(p.cached)} from its cache` : ""}`)
        )
      );
    });
  }

  // -- Responses API items (a conversation in the format of /v1/responses) -------------------------

  /** Whether `m` is a Responses item: the conversation's turns say so, or (no turns) its `type` does. */
  function isResponsesItem(m, format) {
    return format === "responses" || (!format && typeof m.type === "string");
  }

  /** The text of a Responses content value or output: a string, or its text parts. */
  function responsesText(value) {
    if (value === null || value === undefined) return "";
    if (typeof value === "string") return value;
    if (!Array.isArray(value)) return JSON.stringify(value);
    return value.map((part) => (part && typeof part.text === "string" ? part.text : part && part.refusal) || "").join("");
  }

  function responsesChars(m) {
    const summary = Array.isArray(m.summary) ? m.summary : [];
    return (
      responsesText(m.content).length +
      responsesText(m.output).length +
      String(m.arguments ?? m.input ?? "").length +
      summary.reduce((n, part) => n + String((part && part.text) || "").length, 0)
    );
  }

  const ITEM_LABELS = {
    reasoning: "reasoning",
    function_call: "assistant", // its call box says the rest
    custom_tool_call: "assistant",
    function_call_output: "tool output",
    custom_tool_call_output: "tool output",
  };

  /** One Responses item of the replay: its head (seq, role or kind, status, time) and its body. */
  function responsesItemNode(view, m) {
    const type = typeof m.type === "string" ? m.type : "message";
    const isOutput = type.endsWith("_call_output");
    const role = type === "message" ? m.role || "unknown" : isOutput ? "tool" : type === "reasoning" ? "reasoning" : "assistant";
    const status = m.status || "live";
    const li = h("li", {
      class: `message item-${word(type)} role-${word(role)} status-${word(status)}`,
      "data-seq": m.seq,
      "data-role": word(role),
      "data-type": word(type),
      "data-status": word(status),
    });
    const head = h(
      "div",
      { class: "message-head" },
      h("span", { class: "seq" }, `#${m.seq}`),
      h("span", { class: "role" }, type === "message" ? role : ITEM_LABELS[type] || type),
      status !== "live" ? h("span", { class: `badge status-${word(status)}`, title: STATUS_NOTES[status] || null }, status) : null
    );
    li.append(head);
    if (type === "message") {
      add(li, messageParts(m.content));
    } else if (type === "reasoning") {
      add(li, reasoningBody(m));
    } else if (type === "function_call" || type === "custom_tool_call") {
      const name = m.namespace ? `${m.namespace}.${m.name}` : m.name;
      view.callNames.set(m.call_id, name);
      li.append(callNode(name, m.call_id, type === "function_call" ? m.arguments : m.input));
    } else if (isOutput) {
      const text = responsesText(m.output);
      add(
        head,
        h("span", { class: "tool-of" }, "result of ", h("code", null, view.callNames.get(m.call_id) || "?"), " ", h("span", { class: "muted" }, m.call_id || "")),
        h("span", { class: "muted chars" }, `${num(text.length)} chars`)
      );
      li.append(view.toolOutput(m, text));
    } else {
      li.append(clipped(JSON.stringify(itemFields(m), null, 2), "content json")); // a type this page doesn't know
    }
    head.append(h("span", { class: "spacer" }), timeNode(m.created_at));
    view.nodes.set(m.seq, li);
    return li;
  }

  /** A message's content: each text part as text, images and files named, other parts as JSON. */
  function messageParts(content) {
    if (typeof content === "string") return content ? [clipped(content, "content")] : [];
    return (Array.isArray(content) ? content : [content]).map((part) => {
      if (!part || typeof part !== "object") return clipped(String(part), "content");
      if (typeof part.text === "string") return clipped(part.text, "content");
      if (part.type === "refusal") return clipped(String(part.refusal || ""), "content refusal");
      if (part.type === "input_image") {
        const url = typeof part.image_url === "string" && !part.image_url.startsWith("data:") ? ` ${part.image_url}` : "";
        return h("div", { class: "part muted" }, `[image${url}]`);
      }
      if (part.type === "input_file") return h("div", { class: "part muted" }, `[file ${part.filename || part.file_id || ""}]`);
      return clipped(JSON.stringify(part, null, 2), "content json");
    });
  }

  /** A reasoning item: its summary (and reasoning text, if shown), and a note of what is sealed. */
  function reasoningBody(m) {
    const parts = [...(Array.isArray(m.summary) ? m.summary : []), ...(Array.isArray(m.content) ? m.content : [])];
    const out = parts
      .filter((part) => part && typeof part.text === "string" && part.text)
      .map((part) => clipped(part.text, "content reasoning-text"));
    if (typeof m.encrypted_content === "string") {
      out.push(h("div", { class: "part muted small" }, `encrypted reasoning: ${num(m.encrypted_content.length)} chars, replayed as sent`));
    }
    if (!out.length) out.push(h("div", { class: "part muted small" }, "no summary"));
    return out;
  }

  /** A call and its arguments (pretty-printed when they are JSON). */
  function callNode(name, callId, argsValue) {
    let args = argsValue === undefined || argsValue === null ? "" : String(argsValue);
    try {
      args = JSON.stringify(JSON.parse(args), null, 2);
    } catch {
      /* not JSON (a free-form input): shown as sent */
    }
    return h(
      "div",
      { class: "tool-call", "data-call-id": callId || "" },
      h("div", { class: "tool-call-head" }, h("span", { class: "label" }, "tool call"), h("code", { class: "fn" }, name || "?"), h("span", { class: "muted" }, callId || "")),
      clipped(args, "arguments")
    );
  }

  /** An item's own fields, without the ones the trajectory adds. */
  function itemFields(m) {
    const out = {};
    for (const [key, value] of Object.entries(m)) {
      if (!["seq", "created_at", "status", "ref"].includes(key)) out[key] = value;
    }
    return out;
  }

  /** The preview of a long text (PREVIEW characters or PREVIEW_LINES lines), or null if it is short. */
  function previewOf(text) {
    let at = -1; // the end of line PREVIEW_LINES, if it comes before PREVIEW characters
    for (let line = 0; line < PREVIEW_LINES; line++) {
      at = text.indexOf("\n", at + 1);
      if (at === -1 || at >= PREVIEW) break;
    }
    if (at !== -1 && at < PREVIEW && at + 1 < text.length) return text.slice(0, at);
    return text.length > PREVIEW ? text.slice(0, PREVIEW) : null;
  }

  /** A text block: whole if short, else a preview with "show all" (the text is already here). */
  function clipped(text, cls) {
    const preview = previewOf(text);
    if (preview === null) return h("div", { class: `text ${cls}` }, text);
    const full = text;
    return expandable(preview, text.length, async () => full, cls, `Show all ${num(text.length)} chars`);
  }

  /** A preview, a note and a button that loads (once) and shows the full text, or collapses it. */
  function expandable(preview, length, load, cls, label) {
    const box = h("div", { class: `text ${cls} clipped` }, preview);
    const info = h("span", { class: "clip-info muted" }, `Showing ${num(preview.length)} of ${num(length)} characters`);
    const button = h("button", { type: "button", class: "expand" }, label);
    let full = null;
    let open = false;
    button.addEventListener("click", async () => {
      if (open) {
        box.textContent = preview;
        box.classList.add("clipped");
        info.textContent = `Showing ${num(preview.length)} of ${num(length)} characters`;
        button.textContent = label;
        open = false;
        return;
      }
      if (full === null) {
        button.disabled = true;
        button.textContent = "Loading…";
        try {
          full = await load();
        } catch (err) {
          if (err.name === "AbortError") return;
          if (err instanceof ApiError && err.status === 401) return showTokenPrompt(err);
          info.textContent = `Could not load it: ${err.message}`;
          button.textContent = "Retry";
          return;
        } finally {
          button.disabled = false;
        }
      }
      box.textContent = full;
      box.classList.remove("clipped");
      box.classList.add("expanded");
      info.textContent = `All ${num(full.length)} characters`;
      button.textContent = "Collapse";
      open = true;
    });
    return h("div", { class: "expandable" }, box, h("div", { class: "clip-bar" }, button, info));
  }

  // -- charts (inline SVG, built node by node) ----------------------------------------------------

  /** Round axis ticks: a step of 1, 2, 2.5 or 5 × 10^k (whole numbers only), 3 to 5 of them. */
  function axis(value) {
    const rough = Math.max(value, 1) / 4;
    const mag = 10 ** Math.floor(Math.log10(rough));
    let step = mag * ([1, 2, 2.5, 5, 10].find((m) => m * mag >= rough) || 10);
    if (step < 1) step = 1;
    if (!Number.isInteger(step)) step = Math.ceil(step);
    return { step, max: step * Math.max(1, Math.ceil(value / step)) };
  }

  function frame(width, height, margin, scale, n, label) {
    const yMax = scale.max;
    const svg = s("svg", {
      viewBox: `0 0 ${width} ${height}`,
      class: "chart-svg",
      role: "img",
      "aria-label": label,
      preserveAspectRatio: "xMinYMin meet",
    });
    const plotH = height - margin.top - margin.bottom;
    const plotW = width - margin.left - margin.right;
    for (let v = 0; v <= yMax; v += scale.step) {
      const y = margin.top + plotH - (plotH * v) / yMax;
      svg.append(
        s("line", { x1: margin.left, x2: width - margin.right, y1: y, y2: y, class: v ? "grid" : "axis" }),
        s("text", { x: margin.left - 6, y: y + 4, "text-anchor": "end", class: "tick" }, short(v))
      );
    }
    const ticks = Math.min(n, 10);
    for (let k = 0; k < ticks; k++) {
      const i = ticks === 1 ? 0 : Math.round((k * (n - 1)) / (ticks - 1));
      const x = margin.left + (plotW * (i + 0.5)) / n;
      svg.append(s("text", { x, y: height - margin.bottom + 16, "text-anchor": "middle", class: "tick" }, String(i + 1)));
    }
    svg.append(s("text", { x: width - margin.right, y: height - 2, "text-anchor": "end", class: "tick" }, "turn"));
    return { svg, plotH, plotW };
  }

  function emptyChart(text) {
    return h("p", { class: "muted small" }, text);
  }

  function tokenChart(points) {
    if (!points.length) return emptyChart("No turns recorded yet.");
    const width = 900;
    const height = 220;
    const margin = { top: 10, right: 12, bottom: 30, left: 52 };
    const scale = axis(Math.max(1, ...points.map((p) => Math.max(p.sent || 0, p.stored || 0, p.reported || 0))));
    const yMax = scale.max;
    const { svg, plotH, plotW } = frame(width, height, margin, scale, points.length, "Tokens sent vs. transcript stored per turn");
    const slot = plotW / points.length;
    const y = (v) => margin.top + plotH - (plotH * v) / yMax;
    failureBands(svg, points, { slot, margin, plotH });
    points.forEach((p, i) => {
      if (p.sent === null || p.sent === undefined) return;
      const barWidth = Math.min(Math.max(slot * 0.7, 0.5), 48);
      const x = margin.left + slot * (i + 0.5) - barWidth / 2;
      svg.append(
        s(
          "rect",
          { x, y: y(p.sent), width: barWidth, height: Math.max(plotH - (y(p.sent) - margin.top), 0), class: p.error ? "bar sent failed" : "bar sent" },
          s("title", null, `Turn ${p.turn}: ${num(p.sent)} tokens sent${p.stored !== null ? `, ~${num(p.stored)} stored (est.)` : ""}${reportedNote(p)}`)
        )
      );
    });
    reportedTicks(svg, points, { slot, y, left: margin.left });
    const line = points
      .map((p, i) => (p.stored === null ? null : `${(margin.left + slot * (i + 0.5)).toFixed(1)},${y(p.stored).toFixed(1)}`))
      .filter(Boolean);
    if (line.length) {
      svg.append(s("polyline", { points: line.join(" "), class: "line stored" }));
      if (points.length <= 60) {
        points.forEach((p, i) => {
          if (p.stored === null) return;
          svg.append(
            s(
              "circle",
              { cx: margin.left + slot * (i + 0.5), cy: y(p.stored), r: 3, class: "dot stored" },
              s("title", null, `Turn ${p.turn}: ~${num(p.stored)} tokens stored (est.)`)
            )
          );
        });
      }
    }
    return svg;
  }

  function quotaChart(points) {
    const used = points.filter((p) => p.calls !== null && p.calls !== undefined);
    if (!used.length) return emptyChart("No LLM calls recorded yet.");
    const width = 900;
    const height = 120;
    const margin = { top: 10, right: 12, bottom: 30, left: 52 };
    const scale = axis(Math.max(1, ...used.map((p) => p.calls)));
    const yMax = scale.max;
    const { svg, plotH, plotW } = frame(width, height, margin, scale, points.length, "LLM calls used per turn");
    const slot = plotW / points.length;
    const y = (v) => margin.top + plotH - (plotH * v) / yMax;
    let path = "";
    points.forEach((p, i) => {
      if (p.calls === null || p.calls === undefined) return;
      const x0 = margin.left + slot * i;
      const x1 = x0 + slot;
      const yy = y(p.calls).toFixed(1);
      path += `${path ? "L" : "M"}${x0.toFixed(1)},${yy} L${x1.toFixed(1)},${yy} `;
    });
    svg.append(s("path", { d: path, class: "line quota" }, s("title", null, "LLM calls used (the quota's count) after each turn")));
    return svg;
  }

  // -- the inbox and the long-term knowledge document --------------------------------------------
  // (Functions of their own: the views above only call them.)

  const KNOWLEDGE_API = new URL("../v1/knowledge", location.href).href;

  function withQuery(url, params) {
    const out = new URL(url);
    for (const [key, value] of Object.entries(params || {})) {
      if (value !== undefined && value !== null && value !== "") out.searchParams.set(key, value);
    }
    return out.href;
  }

  /** An admin API call on a full URL: a GET, or a write (POST/PUT) of `body` as JSON. */
  async function apiCall(url, method, body, signal) {
    const headers = { Accept: "application/json" };
    const token = auth.get();
    if (token) headers.Authorization = `Bearer ${token}`;
    const init = { method, headers, signal, cache: "no-store", credentials: "omit" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json"; // the API takes JSON writes only
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(url, init);
    } catch (err) {
      if (err.name === "AbortError") throw err;
      throw new ApiError(0, `The proxy did not answer (${err.message})`);
    }
    let data = null;
    try {
      data = await response.json();
    } catch {
      /* not JSON: keep the status */
    }
    if (!response.ok) {
      const message = data && data.error && data.error.message;
      throw new ApiError(response.status, message || response.statusText || `HTTP ${response.status}`);
    }
    return data;
  }

  const INBOX_STATUS = {
    pending: "Waiting: the agent reads it at its next step (its next request through the proxy).",
    delivering: "In the prompt of the turn running now.",
    delivered: "Delivered: in every prompt since, at the same place.",
  };

  /** The conversation's inbox: a box to leave the agent a message, and what was sent and delivered. */
  function inboxPanel(base, query, signal) {
    const url = API + base + "/inbox";
    const list = h("ol", { id: "inbox-list", class: "inbox-list" });
    const empty = h("p", { id: "inbox-empty", class: "muted small" }, "No messages yet.");
    const input = h("textarea", {
      id: "inbox-input",
      rows: 3,
      maxlength: 100000,
      placeholder: "Steer the running agent: it reads this with its next tool result, or before its next message.",
      "aria-label": "A message for the agent",
    });
    const status = h("span", { id: "inbox-status", class: "muted small", role: "status" });
    const send = h("button", { type: "submit", id: "inbox-send" }, "Send to the agent");

    /** The messages listed again; on failure the panel says so (the rest of the page stays). */
    async function refresh() {
      try {
        const page = await apiCall(withQuery(url, { ...query, limit: 1000 }), "GET", undefined, signal);
        list.replaceChildren(...page.data.map(inboxItem));
        empty.textContent = "No messages yet.";
        empty.hidden = page.data.length > 0;
        return page.data;
      } catch (err) {
        if (err.name === "AbortError") throw err;
        empty.textContent = `Could not read the inbox: ${err.message}`;
        empty.hidden = false;
        return [];
      }
    }

    const form = h(
      "form",
      {
        id: "inbox-form",
        class: "inbox-form",
        onsubmit: async (event) => {
          event.preventDefault();
          const content = input.value;
          if (!content.trim()) return;
          send.disabled = true;
          status.textContent = "Sending…";
          try {
            await apiCall(withQuery(url, query), "POST", { content }, signal);
            input.value = "";
            status.textContent = "Queued: delivered at the agent's next step.";
            await refresh();
          } catch (err) {
            if (err instanceof ApiError && err.status === 401) return showTokenPrompt(err);
            status.textContent = `Not sent: ${err.message}`;
          } finally {
            send.disabled = false;
          }
        },
      },
      h("label", { for: "inbox-input" }, "Message for the agent"),
      input,
      h("div", { class: "row" }, send, status)
    );
    const panel = h(
      "section",
      { id: "inbox", class: "card inbox" },
      h("h2", null, "Inbox"),
      h("p", { class: "muted small" }, "Messages for the agent while it works, marked as the user's; each is delivered once, at its next step."),
      list,
      empty,
      form
    );
    panel.refresh = refresh;
    return panel;
  }

  /** The conversation's messages searched (the agent's search_history, for people): each hit a
   *  passage with its seq, role and time, linked to the message in the replay. */
  function historySearchPanel(base, query, signal) {
    const input = h("input", {
      id: "history-search",
      type: "search",
      maxlength: 500,
      placeholder: "Words or exact names: a path, an id, a number…",
      "aria-label": "Search this conversation's messages",
    });
    const list = h("ol", { id: "history-hits", class: "history-hits" });
    const status = h("p", { id: "history-status", class: "muted small", role: "status" });
    const form = h(
      "form",
      {
        id: "history-form",
        class: "row",
        onsubmit: async (event) => {
          event.preventDefault();
          const q = input.value.trim();
          if (!q) return;
          status.textContent = "Searching…";
          try {
            const page = await api(base + "/search", { ...query, q, limit: 20 }, signal);
            list.replaceChildren(...page.data.map(historyHit));
            status.textContent = page.data.length ? `${page.data.length} passages, most relevant first.` : "Nothing matches.";
          } catch (err) {
            if (err.name === "AbortError") throw err;
            if (err instanceof ApiError && err.status === 401) return showTokenPrompt(err);
            list.replaceChildren();
            status.textContent = `Could not search: ${err.message}`;
          }
        },
      },
      input,
      h("button", { type: "submit", id: "history-search-go" }, "Search")
    );
    return h(
      "section",
      { id: "history", class: "card history" },
      h("h2", null, "Search the messages"),
      h("p", { class: "muted small" }, "What the agent finds with search_history: every live message, those left out of its prompt included."),
      form,
      status,
      list
    );
  }

  function historyHit(hit) {
    const where = `#${hit.seq} · ${hit.role} · ${when(hit.created_at)}` + (hit.ref ? ` · ${hit.ref}` : "");
    return h(
      "li",
      { class: "history-hit", "data-seq": hit.seq },
      h("a", { href: `#seq-${hit.seq}`, class: "muted small",
               onclick: (event) => {
                 event.preventDefault();
                 const target = document.querySelector(`#timeline [data-seq="${hit.seq}"]`);
                 if (target) target.scrollIntoView({ block: "center" });
               } }, where),
      h("pre", { class: "history-text" }, hit.text)
    );
  }

  function inboxItem(m) {
    const where =
      m.status === "pending"
        ? null
        : `turn ${num(m.turn)}, ${m.placement === "append" ? "appended to the tool result" : "as a message before"} #${m.seq}`;
    return h(
      "li",
      { class: `inbox-message status-${word(m.status)}`, "data-id": m.id, "data-status": word(m.status) },
      h(
        "div",
        { class: "inbox-head" },
        h("span", { class: `badge status-${word(m.status)}`, title: INBOX_STATUS[m.status] || null }, m.status),
        h("span", { class: "muted small" }, "sent ", timeNode(m.created_at)),
        where ? h("span", { class: "muted small" }, "delivered ", timeNode(m.delivered_at), ` · ${where}`) : null
      ),
      h("div", { class: "inbox-content text" }, m.content)
    );
  }

  /** Delivered inbox messages shown on the replayed message they went upstream with. */
  function markInboxDeliveries(view, messages) {
    for (const m of messages) {
      const node = m.status === "pending" ? null : view.nodes.get(m.seq);
      if (!node) continue;
      node.append(
        h(
          "div",
          { class: "inbox-delivered", "data-inbox-id": m.id },
          h("span", { class: "label" }, m.placement === "append" ? "inbox message, appended here" : "inbox message, sent just before this"),
          h("div", { class: "text" }, m.content)
        )
      );
    }
  }

  /** The knowledge document the conversation's prompts carried (its last turn's), as a link. */
  function knowledgeCard(conversation, turns) {
    const used = turns.filter((t) => t.knowledge).pop();
    if (!used) return null;
    const ns = used.knowledge.namespace;
    const href = "#/knowledge" + (ns ? "/" + encodeURIComponent(ns) : "") + (conversation.tenant ? "?tenant=" + encodeURIComponent(conversation.tenant) : "");
    return h(
      "p",
      { id: "knowledge-used", class: "card knowledge-used" },
      "Long-term knowledge in its prompts: ",
      h("a", { href }, ns ? `namespace ${ns}` : "the default notes"),
      `, version ${num(used.knowledge.version)}.`
    );
  }

  /** A system prompt's text: a string, or the texts of its blocks; anything else as JSON. */
  function systemText(value) {
    if (typeof value === "string") return value;
    if (Array.isArray(value) && value.every((b) => b && typeof b.text === "string")) return value.map((b) => b.text).join("\n\n");
    return JSON.stringify(value, null, 2);
  }

  /** A tool definition's name, in any format (chat nests it under `function`). */
  function toolName(tool) {
    const name = tool && (tool.name || (tool.function && tool.function.name));
    return typeof name === "string" ? name : "?";
  }

  /** One version of a request part: collapsed, its turns in the summary line. */
  function requestPartNode(kind, value, turns, id) {
    const text = kind === "system" ? systemText(value) : JSON.stringify(value, null, 2);
    const what = kind === "system"
      ? `System prompt · ${num(text.length)} chars`
      : `Tools · ${num(Array.isArray(value) ? value.length : 0)}: ${Array.isArray(value) ? value.map(toolName).join(", ") : ""}`;
    const used = turns && turns.length ? ` · turns ${turns.join(", ")}` : "";
    return h(
      "details",
      { class: `request-part kind-${word(kind)}`, id },
      h("summary", null, what, h("span", { class: "muted small" }, used)),
      h("pre", { class: "request-part-value" }, text)
    );
  }

  /** What the conversation's requests sent besides the transcript (Messages' `system`, Responses'
   *  `instructions`, every format's tools; chat's system prompt is a message of the replay): the
   *  current ones, collapsed, then the earlier versions with the turns that sent them. */
  function requestPartsCard(conversation, parts) {
    const current = { system: conversation.system, tools: conversation.tools };
    const rows = [];
    for (const kind of ["system", "tools"]) {
      const versions = parts.filter((p) => p.kind === kind);
      const value = current[kind];
      if (value === null || value === undefined) {
        if (!versions.length) continue;
      } else {
        const now = versions.find((p) => JSON.stringify(p.value) === JSON.stringify(value));
        rows.push(requestPartNode(kind, value, now ? now.turns : null, `request-${kind}`));
      }
      const older = versions.filter((p) => JSON.stringify(p.value) !== JSON.stringify(value));
      if (older.length) {
        rows.push(h(
          "details",
          { class: "request-part-history", id: `request-${kind}-versions` },
          h("summary", { class: "muted small" }, `${num(older.length)} earlier ${kind === "system" ? "system prompt" : "tools list"}${older.length > 1 ? "s" : ""}`),
          older.map((p) => requestPartNode(kind, p.value, p.turns, null))
        ));
      }
    }
    if (!rows.length) return null;
    return h("section", { id: "request-parts", class: "card request-parts" }, h("h2", { class: "small" }, "Sent with every request"), rows);
  }

  function askForTenant(namespace, err) {
    const input = h("input", { id: "knowledge-tenant", name: "tenant", autocomplete: "off", spellcheck: "false", required: true });
    main.replaceChildren(
      h(
        "form",
        {
          id: "knowledge-tenant-form",
          class: "card token-form",
          onsubmit: (event) => {
            event.preventDefault();
            const t = input.value.trim();
            if (t) location.hash = "#/knowledge" + (namespace ? "/" + encodeURIComponent(namespace) : "") + "?tenant=" + encodeURIComponent(t);
          },
        },
        h("h1", null, "Whose knowledge?"),
        h("p", { class: "api-answer" }, err.message),
        h("p", null, "With the admin token every tenant's documents are open: enter a tenant as the conversations list shows it."),
        h("label", { for: "knowledge-tenant" }, "Tenant"),
        h("div", { class: "row" }, input, h("button", { type: "submit" }, "Open"))
      )
    );
    input.focus();
  }

  function diffClass(line) {
    if (line.startsWith("@@") || line.startsWith("+++") || line.startsWith("---")) return "hunk";
    return line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : null;
  }

  /** One knowledge document: its text (editable), its versions, and a diff between two of them. */
  /** Who wrote a knowledge version; an agent's edit links to its conversation and names the turn. */
  function sourceNode(source, tenant) {
    const agent = /^agent:(\S+?)(?: turn (\d+))?$/.exec(source || "");
    if (!agent) return h("span", null, source || "?");
    return h(
      "span",
      { class: "agent-edit" },
      "the agent of ",
      h("a", { href: conversationHref(agent[1], tenant) }, agent[1]),
      agent[2] ? `, turn ${agent[2]}` : ""
    );
  }

  async function showKnowledge(namespace, tenant, signal) {
    document.title = `Knowledge${namespace ? " · " + namespace : ""} · context-proxy`;
    const path = KNOWLEDGE_API + (namespace ? "/" + encodeURIComponent(namespace) : "");
    const query = tenant ? { tenant } : {};
    main.replaceChildren(h("p", { class: "muted" }, "Loading the knowledge document…"));
    let doc;
    try {
      doc = await apiCall(withQuery(path, query), "GET", undefined, signal);
    } catch (err) {
      if (!(err instanceof ApiError && err.status === 400 && !tenant)) throw err;
      return askForTenant(namespace, err); // the admin sees every tenant: which one's notes?
    }
    const versions = await apiCall(withQuery(path + "/versions", { ...query, limit: 100 }), "GET", undefined, signal);
    const hrefOf = (ns) => "#/knowledge" + (ns ? "/" + encodeURIComponent(ns) : "") + (tenant ? "?tenant=" + encodeURIComponent(tenant) : "");

    const editor = h("textarea", { id: "knowledge-text", rows: 22, spellcheck: "false", "aria-label": "The document" });
    editor.value = doc.text; // a property: never markup
    const status = h("span", { id: "knowledge-status", class: "muted small", role: "status" });
    const save = h("button", { type: "submit", id: "knowledge-save" }, "Save as a new version");
    const form = h(
      "form",
      {
        id: "knowledge-form",
        onsubmit: async (event) => {
          event.preventDefault();
          save.disabled = true;
          try {
            const written = await apiCall(withQuery(path, query), "PUT", { text: editor.value, base_version: doc.version }, signal);
            status.textContent = `Saved as version ${written.version}.`;
            route();
          } catch (err) {
            if (err instanceof ApiError && err.status === 401) return showTokenPrompt(err);
            status.textContent = `Not saved: ${err.message}`;
          } finally {
            save.disabled = false;
          }
        },
      },
      editor,
      h("div", { class: "row" }, save, status)
    );

    const diffOut = h("pre", { id: "knowledge-diff", class: "diff", hidden: true });
    const fromSel = h("select", { id: "diff-from", "aria-label": "From version" });
    const toSel = h("select", { id: "diff-to", "aria-label": "To version" });
    const numbers = versions.data.map((v) => v.version);
    for (const n of [...numbers, 0]) fromSel.append(h("option", { value: n }, n ? `version ${n}` : "empty"));
    for (const n of numbers) toSel.append(h("option", { value: n }, `version ${n}`));
    if (numbers.length > 1) fromSel.value = String(numbers[1]);
    const showDiff = async () => {
      const d = await apiCall(withQuery(path + "/diff", { ...query, from: fromSel.value, to: toSel.value }), "GET", undefined, signal);
      diffOut.replaceChildren(
        ...d.diff.split("\n").map((line) => h("span", { class: diffClass(line) }, line + "\n"))
      );
      diffOut.hidden = false;
    };
    const diffButton = h("button", { type: "button", id: "diff-show", onclick: () => showDiff().catch((err) => showFailure(err, signal)) }, "Show diff");

    main.replaceChildren(
      h(
        "section",
        { class: "knowledge-view", "data-version": doc.version },
        h("p", { class: "crumbs" }, h("a", { href: "#/" }, "← Conversations")),
        h("h1", null, "Long-term knowledge", namespace ? ` · ${namespace}` : ""),
        h(
          "p",
          { class: "muted small" },
          doc.version ? [`Version ${doc.version}, written ${when(doc.created_at)} by `, sourceNode(doc.source, doc.tenant), ". "] : "Nobody wrote it yet: this is the template it starts from. ",
          "Agents read it in their prompts when knowledge is on, and edit it with the proxy's knowledge tools; every version is kept."
        ),
        h(
          "nav",
          { class: "namespaces" },
          "Documents: ",
          h("a", { href: hrefOf(null) }, "default"),
          (doc.namespaces || []).map((ns) => [" · ", h("a", { href: hrefOf(ns) }, ns)])
        ),
        form,
        h("h2", null, "Versions"),
        h(
          "table",
          { id: "knowledge-versions", class: "grid" },
          h("thead", null, h("tr", null, ["Version", "Written", "By", "Characters"].map((t) => h("th", { scope: "col" }, t)))),
          h(
            "tbody",
            null,
            versions.data.map((v) => h("tr", { "data-version": v.version }, h("td", { class: "num" }, num(v.version)), h("td", null, timeNode(v.created_at)), h("td", { class: "source" }, sourceNode(v.source, v.tenant)), h("td", { class: "num" }, num(v.chars))))
          )
        ),
        numbers.length ? h("div", { class: "row diff-controls" }, "Diff from ", fromSel, " to ", toSel, diffButton) : null,
        diffOut
      )
    );
  }

  // The start-up URL's ?token=: kept for the tab, then gone from the address bar and history.
  const query = new URLSearchParams(location.search);
  if (query.has("token")) {
    if (query.get("token")) auth.set(query.get("token"));
    query.delete("token");
    const rest = query.toString();
    history.replaceState(null, "", location.pathname + (rest ? "?" + rest : "") + location.hash);
  }
  window.addEventListener("hashchange", route);
  route();
})();
