"""The agent's real local tools, confined to the workspace: list a folder, read and write a file,
run a harmless command.

Whatever the model asks, a tool answers with text (an error is an answer too), as an agent's
tools do: the session never stops because a small model called a tool badly.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
from pathlib import Path
from typing import Any

MAX_READ_CHARS = 200_000
COMMAND_TIMEOUT_S = 20
# Programs run_command may start (no shell): they read the workspace; python3 only as `-m unittest`.
ALLOWED_PROGRAMS = frozenset({"ls", "cat", "head", "tail", "wc", "grep", "sort", "uniq", "python3"})
# unittest's "Ran 4 tests in 0.001s": the one thing in a tool output that differs between runs.
TEST_TIMING = re.compile(r"(Ran \d+ tests? in )\d+\.\d+s")


def _function(name: str, description: str, **properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": list(properties)},
        },
    }


TOOL_DEFINITIONS = [
    _function("list_dir", "List the entries of a folder of the project (folders end with /).",
              path={"type": "string", "description": "Folder, relative to the project root, e.g. '.'"}),
    _function("read_file", "Read a whole text file of the project.",
              path={"type": "string", "description": "File, relative to the project root"}),
    _function("write_file", "Write a text file of the project, replacing its content.",
              path={"type": "string", "description": "File, relative to the project root"},
              content={"type": "string", "description": "The whole new content"}),
    _function("run_command", "Run a command in the project root, e.g. 'python3 -m unittest discover -s tests' "
              f"or 'grep -c ERROR logs/app.log'. Programs: {', '.join(sorted(ALLOWED_PROGRAMS))}.",
              command={"type": "string", "description": "The command line (no shell features)"}),
]


class Tools:
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    async def call(self, name: str, arguments: str) -> str:
        try:
            args = json.loads(arguments or "{}")
            if not isinstance(args, dict):
                raise ValueError("arguments are not a JSON object")
        except ValueError as exc:
            return f"error: bad arguments for {name}: {exc}"
        try:
            if name == "list_dir":
                return self._list_dir(str(args.get("path", ".")))
            if name == "read_file":
                return self._read_file(str(args["path"]))
            if name == "write_file":
                return self._write_file(str(args["path"]), str(args.get("content", "")))
            if name == "run_command":
                return await self._run(str(args["command"]))
        except KeyError as exc:
            return f"error: {name} needs the argument {exc}"
        except (OSError, ValueError) as exc:
            return f"error: {exc}"
        return f"error: no tool named {name!r}"

    def _path(self, relative: str) -> Path:
        path = (self.root / relative).resolve()
        if path != self.root and self.root not in path.parents:
            raise ValueError(f"{relative} is outside the project")
        return path

    def _list_dir(self, relative: str) -> str:
        path = self._path(relative)
        entries = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
        return "\n".join(entries) or "(empty folder)"

    def _read_file(self, relative: str) -> str:
        return self._path(relative).read_text(errors="replace")[:MAX_READ_CHARS]

    def _write_file(self, relative: str, content: str) -> str:
        path = self._path(relative)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        return f"wrote {len(content)} characters to {relative}"

    async def _run(self, command: str) -> str:
        argv = shlex.split(command)
        if not argv or argv[0] not in ALLOWED_PROGRAMS:
            return f"error: only these programs may run: {', '.join(sorted(ALLOWED_PROGRAMS))}"
        if argv[0] == "python3" and argv[1:3] != ["-m", "unittest"]:
            return "error: python3 only runs the tests here: python3 -m unittest ..."
        for arg in argv[1:]:
            if not arg.startswith("-") and ("/" in arg or arg == ".."):
                self._path(arg)  # a path argument must stay in the project
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=self.root, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), COMMAND_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return f"error: the command ran past {COMMAND_TIMEOUT_S} s and was stopped"
        text = TEST_TIMING.sub(r"\g<1>0.000s", out.decode(errors="replace"))
        return f"exit code {proc.returncode}\n{text[:MAX_READ_CHARS]}"
