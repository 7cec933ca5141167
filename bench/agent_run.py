"""A generated coding-agent run with planted facts, for bench/context.py.

The run is a script of upstream requests ("steps"): a user message opens a turn, the model calls
tools for a few steps, then answers; the next user message follows. Tool outputs look like a
real agent's (file contents, test runs, logs full of timestamps, counters and measurements, git
history, hex dumps), most small, some long enough to be shortened.

Forty facts are planted the way an agent meets them, each a sentence carrying a value (a path,
a ticket, a number) that must still reach the upstream, or be found again, once its message has
left the prompt. How each is written varies (several templates per kind, comment styles, log
formats, field names), so the bench does not plant in the one shape an extractor looks for:
- note: a comment inside a ~30 KB code listing (`read_file`);
- warn: a warning or error line among a couple of thousand log lines (`tail_log`);
- json: a prose field among the short fields of a JSON result (`api_get`);
- finding: a sentence of the assistant's own, in its answer or next to a tool call;
- decision: the user's own instruction in a follow-up message (the whole sentence must arrive).
Every planted value occurs nowhere else in the run (checked), so finding it proves it was kept.
"""

from __future__ import annotations

import json
import random
import re
import string
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

KINDS = ("note", "warn", "json", "finding", "decision")
PLANTS_PER_KIND = {"note": 8, "warn": 8, "json": 8, "finding": 8, "decision": 8}

# (template, the value's sort): {v} is the value. Written as agents meet them, in several styles.
NOTES = [
    ("    # NOTE: the root cause is in {v}, where credit notes are rounded twice", "path"),
    ("    # Careful: amounts are kept in cents since {v}; never divide them again here", "ticket"),
    ("    // why: the webhook is retried {v} times before the payment is marked lost", "number"),
    ("    # FIXME(ops): the nightly export skips every account migrated by {v}", "path"),
    ("    # Beware -- this branch only runs for merchants onboarded before batch {v}", "number"),
]
WARNS = [
    ("{ts} WARN [ledger] drift totals {v} cents after the nightly import", "number"),
    ("{ts} WARNING reconciliation: account {v} was skipped, its IBAN is missing", "ticket"),
    ('{ts} level=warn msg="retry budget exhausted while calling {v}"', "path"),
    ("{ts} ERROR payout {v} rejected by the bank: invalid creditor id", "number"),
    ("{ts} E [sepa] mandate store at {v} refused the batch (read-only)", "path"),
]
JSONS = [
    ("note", "Refunds for merchant {v} are paused until the audit closes", "ticket"),
    ("comment", "the ledger drift totals {v} cents since the March import", "number"),
    ("description", "this handler moved to {v} during the split of the billing service", "path"),
    ("remarks", "customer asked twice; the dispute is tracked as {v} with finance", "ticket"),
]
FINDINGS = [
    "Found it: the root cause is in {v}, where credit notes are rounded twice.",
    "The ledger drift totals {v} cents, all from invoices created before the migration.",
    "This is tracked as {v}; I will look at the handler next.",
    "So the export job handled {v} invoices in that batch, all with the old rounding.",
    "Looking at the trace, the stale rate comes from {v} and nowhere else.",
]

SYSTEM = (
    "You are a careful coding agent working in the repository of an invoicing service. Work step by step: "
    "read the code before changing it, run the tests after each change, keep changes small, and report what "
    "you did. Use the tools given; never invent file contents. When the user gives an instruction, follow it "
    "for the rest of the session."
)
TASK = "Task: make the test suite of the invoicing service pass again; CI run 88213 has the failing tests."

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {arg: {"type": "string"} for arg in args}, "required": list(args)}}}
    for name, description, args in (
        ("read_file", "Read a file of the repository.", ("path",)),
        ("edit_file", "Replace text in a file.", ("path", "old", "new")),
        ("run_tests", "Run the test suite, or part of it.", ("selector",)),
        ("grep", "Search the repository.", ("pattern",)),
        ("tail_log", "Show the end of a service log.", ("service",)),
        ("git_log", "Show recent commits.", ("range",)),
        ("git_show", "Show one commit.", ("sha",)),
        ("fetch_url", "Fetch a web page as text.", ("url",)),
        ("hexdump", "Show the bytes of a file.", ("path",)),
        ("api_get", "Call the service's HTTP API.", ("path",)),
    )
]

# Files the agent keeps coming back to: named again and again, as in a real run.
MODULES = [f"src/invoicing/{name}.py" for name in (
    "models", "rounding", "tax", "currency", "pdf", "api", "db", "queue", "mailer", "auth", "settings", "cli")]
TESTS = [f"tests/test_{name}.py" for name in ("models", "rounding", "tax", "currency", "api", "queue")]
SIZES = (200, 400, 800, 1500, 3000, 6000, 20000, 30000, 45000)


@dataclass(frozen=True)
class Plant:
    kind: str
    value: str  # what must reach the upstream, verbatim
    step: int  # the step whose messages carry it (the user message opening it, for a decision)
    sentence: str = ""  # the line or sentence it was planted in

    @property
    def query(self) -> str:
        """The sentence without its value: what an agent remembering it would search for (a
        decision, all sentence, without its number)."""
        if self.value == self.sentence:
            return " ".join(re.sub(r"\d+", " ", self.sentence).split())
        return " ".join(self.sentence.replace(self.value, " ").split())


@dataclass
class Step:
    """One upstream request: the user message that opens it (if any), then what the model answers
    (text, or tool calls with the outputs the client's tools give back)."""

    user: str | None
    content: str | None
    calls: list[tuple[str, str, str]] = field(default_factory=list)  # (call id, tool name, arguments JSON)
    outputs: dict[str, str] = field(default_factory=dict)  # call id -> the tool's output


@dataclass
class Run:
    system: str
    task: str
    tools: list[dict[str, Any]]
    steps: list[Step]
    plants: list[Plant]

    def size(self) -> int:
        """Characters of every message of the run."""
        chars = len(self.system) + len(self.task)
        for step in self.steps:
            chars += len(step.user or "") + len(step.content or "") + sum(len(a) for _, _, a in step.calls)
            chars += sum(len(o) for o in step.outputs.values())
        return chars


class _Gen:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.used: set[str] = set()
        self.calls = 0

    def unique(self, make: Any) -> str:
        while True:
            value = make()
            if value not in self.used:
                self.used.add(value)
                return value

    def call_id(self) -> str:
        self.calls += 1
        return f"call_{self.calls:04d}" + "".join(self.rng.choices(string.ascii_letters + string.digits, k=20))

    # -- planted values ------------------------------------------------------------------------

    def value(self, sort: str) -> str:
        r = self.rng
        if sort == "path":
            return self.unique(lambda: f"services/{r.choice(['billing', 'ledger', 'exports', 'payouts'])}/"
                               f"{r.choice(['vat', 'dunning', 'sepa', 'credit', 'proforma', 'mandates'])}_{r.randint(10, 99)}.py")
        if sort == "ticket":
            return self.unique(lambda: f"{r.choice(['PAY', 'INV', 'OPS', 'FIN'])}-{r.randint(1000, 9999)}")
        return self.unique(lambda: str(r.randint(200000, 899999)))  # the noise's numbers have 5 digits at most

    def decision(self, i: int) -> tuple[str, str]:
        options = [
            "Decision: keep the retry limit at {n} and do not change the backoff.",
            "Decision: we stay on Python 3.11 for now; no upgrade in this task (note {n}).",
            "Decision: never touch legacy/auth_{n}.py, it is frozen until the audit.",
            "Decision: invoices below {n} cents are rounded half-even, never half-up.",
            "Decision: use the staging database db-stage-{n} for every manual check.",
            "Decision: commit messages must start with the ticket id; squash before pushing (rule {n}).",
            "Decision: the PDF export stays on the old renderer until release {n}.",
        ]
        value = self.unique(lambda: options[i % len(options)].format(n=self.rng.randint(11, 97)))
        return value, value

    def plant(self, kind: str, i: int) -> tuple[str, str]:
        """(value, sentence) of the i-th plant of `kind`."""
        if kind == "decision":
            return self.decision(i)
        if kind == "note":
            template, sort = NOTES[i % len(NOTES)]
        elif kind == "warn":
            template, sort = WARNS[i % len(WARNS)]
        elif kind == "json":
            field, template, sort = JSONS[i % len(JSONS)]
            value = self.value(sort)
            return value, f"{field}: {template.format(v=value)}"
        else:
            template, sort = FINDINGS[i % len(FINDINGS)], ("path", "number", "ticket", "number", "path")[i % len(FINDINGS)]
        value = self.value(sort)
        return value, template.format(v=value, ts="{ts}")

    def code_with(self, sentence: str, about: str, step: int) -> str:
        """A ~30 KB listing with `sentence` (a comment) somewhere in its middle."""
        lines = self.output("read_file", step, 30000, about).splitlines()
        at = self.rng.randint(len(lines) // 4, 3 * len(lines) // 4)
        return "\n".join([*lines[:at], sentence, *lines[at:]])

    def log_with(self, sentence: str, step: int) -> str:
        """A couple of thousand log lines with `sentence` (a warning) somewhere among them."""
        lines = self.output("tail_log", step, 200_000).splitlines()
        at = self.rng.randint(len(lines) // 5, 4 * len(lines) // 5)
        return "\n".join([*lines[:at], sentence.format(ts=self.timestamp(step, at)), *lines[at:]])

    def json_with(self, sentence: str) -> str:
        """A JSON result of short records, one of which has a prose field."""
        r = self.rng
        field, prose = sentence.split(": ", 1)
        records = [{"id": r.randint(10000, 99999), "status": r.choice(["open", "paid", "void"]),
                    "amount": r.randint(100, 99999), "currency": "EUR"} for _ in range(40)]
        records[r.randint(5, 35)][field] = prose
        return json.dumps({"object": "list", "data": records})

    # -- noise ---------------------------------------------------------------------------------

    def timestamp(self, step: int, line: int) -> str:
        return f"2024-05-{1 + step % 28:02d}T{step % 24:02d}:{line % 60:02d}:{(line * 7) % 60:02d}.{self.rng.randint(0, 999):03d}Z"

    def output(self, tool: str, step: int, size: int, about: str = "") -> str:
        r = self.rng
        lines: list[str] = []
        if about:
            lines.append(f"==> {about} <==")
        while sum(len(line) + 1 for line in lines) < size:
            n = len(lines)
            if tool == "tail_log":
                lines.append(f"{self.timestamp(step, n)} INFO [{n:05d}] order {r.randint(10000, 99999)} processed in "
                             f"{r.randint(3, 900)} ms (cpu={r.random():.2f}, {r.randint(1, 64)} KB) worker-{n % 4}")
            elif tool == "run_tests":
                test = r.choice(TESTS)
                outcome = r.choice(["PASSED", "PASSED", "PASSED", "FAILED"])
                lines.append(f"{test}::test_case_{n % 40} {outcome} [{min(100, n)}%] ({r.random() * 2:.2f}s)")
            elif tool == "git_log":
                sha = "".join(r.choices("0123456789abcdef", k=12))
                lines.append(f"{sha} {self.timestamp(step, n)[:10]} fix: adjust {r.choice(MODULES)} handling")
            elif tool == "hexdump":
                data = " ".join(f"{r.randint(0, 0xFFFF):04x}" for _ in range(8))
                lines.append(f"{n * 16:08x}: {data}  ................")
            elif tool == "grep":
                lines.append(f"{r.choice(MODULES)}:{r.randint(1, 400)}:    total = round(amount * rate, {r.randint(0, 4)})")
            else:  # file contents, fetched pages, commits: code-like text
                lines.append(f"    {r.choice(['def', 'return', 'if', 'for'])} value_{n % 50}(self, amount) -> "
                             f"Decimal:  # line {n}")
        return "\n".join(lines)[:max(size, 80)]


def generate_run(steps: int = 300, seed: int = 7) -> Run:
    """A run of `steps` upstream requests with the planted facts of PLANTS_PER_KIND."""
    gen = _Gen(seed)
    r = gen.rng
    kinds = [k for k in KINDS for _ in range(PLANTS_PER_KIND[k])]
    r.shuffle(kinds)
    last = int(steps * 0.85)  # the last ones are still in the prompt at the end: nothing to measure
    seen: dict[str, int] = defaultdict(int)
    due = {}
    for i, kind in enumerate(kinds):
        due[round(6 + i * (last - 6) / len(kinds))] = (kind, *gen.plant(kind, seen[kind]))
        seen[kind] += 1
    waiting: list[tuple[str, str, str]] = []  # planted as soon as a step of the right sort comes
    plants: list[Plant] = []
    out: list[Step] = []
    tool_steps_left = 0
    user_turn = 0

    def take(*sorts: str) -> tuple[str | None, str, str]:
        for n, (kind, value, sentence) in enumerate(waiting):
            if kind in sorts:
                del waiting[n]
                plants.append(Plant(kind, value, len(out), sentence))
                return kind, value, sentence
        return None, "", ""

    while len(out) < steps:
        i = len(out)
        if i in due:
            waiting.append(due[i])
        user = None
        if tool_steps_left == 0:
            user_turn += 1
            kind, value, _ = take("decision")
            user = value if kind else f"Good. Next: look at {r.choice(MODULES)} and check the tests again ({user_turn})."
            tool_steps_left = r.randint(2, 6)  # then the answer: most steps are tool rounds, as in a real run
        if tool_steps_left == 1:  # the turn's answer
            kind, _, sentence = take("finding")
            content = sentence if kind else "Done with this part: the change is in and the tests pass locally."
            out.append(Step(user, content))
            tool_steps_left = 0
            continue
        tool_steps_left -= 1
        call = gen.call_id()
        content = None
        kind, value, sentence = take("note", "warn", "json")
        module = r.choice(MODULES)
        if kind == "note":
            name, args, output = "read_file", {"path": module}, gen.code_with(sentence, module, i)
        elif kind == "warn":
            name, args, output = "tail_log", {"service": "ledger"}, gen.log_with(sentence, i)
            plants[-1] = Plant(kind, value, plants[-1].step, sentence.replace("{ts} ", ""))  # the line, its time aside
        elif kind == "json":
            name, args, output = "api_get", {"path": "/v1/invoices?limit=40"}, gen.json_with(sentence)
        else:
            name = r.choice(["read_file", "read_file", "run_tests", "grep", "tail_log", "git_log", "edit_file", "hexdump"])
            size = r.choice(SIZES)
            args = {"read_file": {"path": module}, "edit_file": {"path": module, "old": "round(", "new": "quantize("},
                    "run_tests": {"selector": "tests"}, "grep": {"pattern": "round("}, "tail_log": {"service": "worker"},
                    "git_log": {"range": "HEAD~20.."}, "hexdump": {"path": "fixtures/invoice.bin"}}[name]
            output = "ok: 1 replacement" if name == "edit_file" else gen.output(name, i, size, module if name == "read_file" else "")
            found, _, said = take("finding") if r.random() < 0.5 else (None, "", "")
            if found:
                content = said  # a finding stated next to a tool call
        out.append(Step(user, content, [(call, name, json.dumps(args))], {call: output}))
    if waiting:
        raise ValueError(f"{steps} steps are too few to plant {len(kinds)} facts ({len(waiting)} found no step)")
    run = Run(SYSTEM, TASK, TOOLS, out, plants)
    _check_unique(run)
    return run


def occurs(value: str, text: str) -> bool:
    """Whether `value` occurs in `text` as a whole (not inside a longer number or name)."""
    return re.search(rf"(?<![\w.-]){re.escape(value)}(?![\w-])", text) is not None


def _check_unique(run: Run) -> None:
    """Each planted value occurs in its own step only, so finding it upstream proves it was kept."""
    texts = [json.dumps([step.user, step.content, step.calls, step.outputs]) for step in run.steps]
    for plant in run.plants:
        for i, text in enumerate(texts):
            if i != plant.step and plant.value in text and occurs(plant.value, text):
                raise AssertionError(f"planted {plant.kind} {plant.value!r} also occurs at step {i}")


__all__ = ["KINDS", "Plant", "Run", "Step", "generate_run", "occurs"]
