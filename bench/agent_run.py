"""A generated coding-agent run with planted facts, for bench/context.py.

The run is a script of upstream requests ("steps"): a user message opens a turn, the model calls
tools for a few steps, then answers; the next user message follows. Tool outputs look like a
real agent's (file contents, test runs, logs full of timestamps, counters and measurements, git
history, hex dumps), most small, some long enough to be shortened.

Forty facts are planted where a real run names them, and must still reach the upstream at the
last step once their message has left the prompt:
- paths: a file the model reads (`read_file` arguments) that is never read again;
- shas: a commit the model looks at (`git_show` arguments);
- URLs: a page the model fetches (`fetch_url` arguments);
- tickets: named in the model's own words next to a tool call;
- numbers: a figure in the model's answer;
- decisions: the user's own instruction in a follow-up message (the whole sentence must arrive).
Every planted value occurs nowhere else in the run (checked), so finding it proves it was kept.
"""

from __future__ import annotations

import json
import random
import re
import string
from dataclasses import dataclass, field
from typing import Any

KINDS = ("path", "sha", "url", "ticket", "number", "decision")
PLANTS_PER_KIND = {"path": 7, "sha": 7, "url": 6, "ticket": 7, "number": 6, "decision": 7}

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

    def plant_value(self, kind: str, i: int) -> str:
        r = self.rng
        if kind == "path":
            return self.unique(lambda: f"src/{r.choice(['billing', 'ledger', 'exports'])}/{r.choice(['vat', 'dunning', 'sepa', 'credit', 'proforma', 'ledger'])}_{r.randint(10, 99)}.py")
        if kind == "sha":
            return self.unique(lambda: "".join(r.choices("0123456789abcdef", k=5)) + r.choice("abcdef") + r.choice("0123456789") + "".join(r.choices("0123456789abcdef", k=5)))
        if kind == "url":
            return self.unique(lambda: f"https://docs.payments.example.com/{r.choice(['api', 'guides', 'errors'])}/{r.randint(100, 999)}-{r.choice(['rounding', 'vat', 'refunds', 'webhooks'])}")
        if kind == "ticket":
            return self.unique(lambda: f"{r.choice(['PAY', 'INV', 'OPS'])}-{r.randint(1000, 9999)}")
        if kind == "number":
            return self.unique(lambda: str(r.randint(200000, 899999)))  # the noise's numbers have 5 digits at most
        options = [
            "Decision: keep the retry limit at {n} and do not change the backoff.",
            "Decision: we stay on Python 3.11 for now; no upgrade in this task (note {n}).",
            "Decision: never touch legacy/auth_{n}.py, it is frozen until the audit.",
            "Decision: invoices below {n} cents are rounded half-even, never half-up.",
            "Decision: use the staging database db-stage-{n} for every manual check.",
            "Decision: commit messages must start with the ticket id; squash before pushing (rule {n}).",
            "Decision: the PDF export stays on the old renderer until release {n}.",
        ]
        return self.unique(lambda: options[i % len(options)].format(n=r.randint(11, 97)))

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
    due = {round(6 + i * (last - 6) / len(kinds)): (kind, gen.plant_value(kind, i)) for i, kind in enumerate(kinds)}
    waiting: list[tuple[str, str]] = []  # planted as soon as a step of the right sort comes
    plants: list[Plant] = []
    out: list[Step] = []
    tool_steps_left = 0
    user_turn = 0

    def take(*sorts: str) -> tuple[str | None, str]:
        for n, (kind, value) in enumerate(waiting):
            if kind in sorts:
                del waiting[n]
                plants.append(Plant(kind, value, len(out)))
                return kind, value
        return None, ""

    while len(out) < steps:
        i = len(out)
        if i in due:
            waiting.append(due[i])
        user = None
        if tool_steps_left == 0:
            user_turn += 1
            kind, value = take("decision")
            user = value if kind else f"Good. Next: look at {r.choice(MODULES)} and check the tests again ({user_turn})."
            tool_steps_left = r.randint(2, 6)  # then the answer: most steps are tool rounds, as in a real run
        if tool_steps_left == 1:  # the turn's answer
            kind, value = take("number")
            if kind:
                content = f"Found it: the export job handled {value} invoices in that batch, all with the old rounding."
            else:
                content = "Done with this part: the change is in and the tests pass locally."
            out.append(Step(user, content))
            tool_steps_left = 0
            continue
        tool_steps_left -= 1
        call = gen.call_id()
        content = None
        kind, value = take("path", "sha", "url", "ticket")
        if kind == "path":
            name, args, output = "read_file", {"path": value}, gen.output("read_file", i, r.choice(SIZES[:5]), value)
        elif kind == "sha":
            name, args, output = "git_show", {"sha": value}, gen.output("git_show", i, r.choice(SIZES[:5]), f"commit {value}")
        elif kind == "url":
            name, args, output = "fetch_url", {"url": value}, gen.output("fetch_url", i, r.choice(SIZES[:5]))
        else:
            name = r.choice(["read_file", "read_file", "run_tests", "grep", "tail_log", "git_log", "edit_file", "hexdump"])
            size = r.choice(SIZES)
            module = r.choice(MODULES)
            args = {"read_file": {"path": module}, "edit_file": {"path": module, "old": "round(", "new": "quantize("},
                    "run_tests": {"selector": "tests"}, "grep": {"pattern": "round("}, "tail_log": {"service": "worker"},
                    "git_log": {"range": "HEAD~20.."}, "hexdump": {"path": "fixtures/invoice.bin"}}[name]
            output = "ok: 1 replacement" if name == "edit_file" else gen.output(name, i, size, module if name == "read_file" else "")
            if kind == "ticket":
                content = f"This is tracked as {value}; I will look at the handler next."
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
