"""The fabricated agent side of a conversation (format-neutral): tasks, assistant steps,
tool calls and their results, follow-ups and compaction summaries."""

from __future__ import annotations

import datetime as _dt
import random
from dataclasses import dataclass
from typing import Any

from .spec import TrafficSpec
from .text import NOUNS, VERBS, b62, code_pool, ident, log_pool, loguniform, prose, sentence, take

_PROJECTS = (
    ("billing-service", "py"), ("edge-router", "ts"), ("ledger", "py"), ("web-console", "ts"),
    ("ingest-worker", "py"), ("search-api", "ts"), ("model-gateway", "py"), ("docs-site", "ts"),
)  # fmt: skip
_USERS = ("dev", "alex", "sam", "kim", "lee", "jo", "max", "ren")
_TASKS = (
    "The {m} module returns stale {n}s after a reload; find out why and fix it",
    "Add a --dry-run flag to the {m} command and cover it with tests",
    "Refactor {f} in {path} so it no longer blocks on I/O",
    "Tests in tests/test_{m}.py started failing after the last merge, please investigate",
    "Write a migration that renames the {n} column and update the callers",
    "Add retry with backoff around the {n} client in {path}",
    "Explain how {f} is used across the codebase and remove the dead code paths",
    "Implement pagination for the {n} listing endpoint",
    "Port {path} to the new {n} API and keep behaviour identical",
    "Profile {f} and make it at least twice as fast on large inputs",
)
_FOLLOWUPS = (
    "Looks good. Now add a test for the empty case.",
    "Can you also update the changelog?",
    "That broke the linter, please fix it.",
    "Please keep the public API unchanged and try again.",
    "Run the full test suite and tell me what still fails.",
    "Good. Next, handle the timeout case the same way.",
    "Use the existing helper in utils instead of the new function.",
    "Why did you change that file? Revert the unrelated part.",
)
_ASSISTANT_LINES = (
    "Let me look at how this is wired up first.",
    "I'll check the failing test before changing anything.",
    "The cause is in the cache lookup; I'll fix it there.",
    "Now I'll run the tests to confirm the fix.",
    "I'll search for other callers of this function.",
    "That edit is in; next, the tests.",
    "The build passes now. Checking the remaining failure.",
    "I'll update the task list and continue.",
)
_RULES = (
    "Use the project's Makefile targets instead of calling tools directly.",
    "Never commit generated files.",
    "All new code needs type hints and a test.",
    "Keep functions under fifty lines where practical.",
    "Log with the structured logger, never print.",
    "Do not add dependencies without asking.",
    "Prefer small, reviewable diffs.",
    "Run the formatter before finishing.",
)
_TOOL_WEIGHTS = (
    ("Read", 25), ("Bash", 20), ("Grep", 14), ("Glob", 7), ("Edit", 15), ("MultiEdit", 2),
    ("Write", 4), ("TodoWrite", 6), ("WebFetch", 2), ("Agent", 3),
)  # fmt: skip


@dataclass(slots=True)
class Call:
    id: str
    name: str  # catalogue (Claude Code) name
    input: dict[str, Any]


@dataclass(slots=True)
class Step:
    thinking: str | None
    text: str | None
    calls: list[Call]


@dataclass(slots=True)
class Result:
    call_id: str
    text: str
    is_error: bool
    as_list: bool


class Dialogue:
    """Fabricates one agent's side of a conversation (format-neutral)."""

    def __init__(self, rng: random.Random, spec: TrafficSpec, *, thinking: bool, id_style: str):
        self.rng = rng
        self.spec = spec
        self.thinking = thinking
        self.id_style = id_style
        project, lang = rng.choice(_PROJECTS)
        self.project = project
        self.lang = lang
        self.user = rng.choice(_USERS)
        self.cwd = f"/home/{self.user}/src/{project}"
        ext = "py" if lang == "py" else "ts"
        src = "src/" + project.replace("-", "_") if lang == "py" else "src"
        self.files = [f"{self.cwd}/{src}/{n}.{ext}" for n in rng.sample(NOUNS, 8)]
        self.files += [f"{self.cwd}/tests/test_{n}.{ext}" for n in rng.sample(NOUNS, 4)]
        n, f, _ = ident(rng)
        path = rng.choice(self.files).removeprefix(self.cwd + "/")
        issue = rng.randint(100, 9999)
        self.task = rng.choice(_TASKS).format(m=n, n=rng.choice(NOUNS), f=f, path=path)
        self.task += f" (see #{issue})."
        self.rules = rng.sample(_RULES, 4)
        self.date = (_dt.date(2026, 11, 1) + _dt.timedelta(days=rng.randrange(60))).isoformat()
        self.touched: list[str] = []

    # ids -------------------------------------------------------------------
    def _call_id(self) -> str:
        if self.id_style == "toolu":
            return "toolu_01" + b62(self.rng, 22)
        return "call_" + b62(self.rng, 24)

    # steps -----------------------------------------------------------------
    def step(self) -> Step:
        rng = self.rng
        thinking = None
        if self.thinking and rng.random() < 0.3:
            thinking = prose(rng, rng.randint(200, 1200), "the next tool")
        text = rng.choice(_ASSISTANT_LINES) if rng.random() < 0.6 else None
        calls: list[Call] = []
        if rng.random() < 0.85:
            n_calls = rng.choices((1, 2, 3), (6, 3, 1))[0]
            names = [n for n, _ in _TOOL_WEIGHTS]
            weights = [w for _, w in _TOOL_WEIGHTS]
            for name in rng.choices(names, weights, k=n_calls):
                calls.append(Call(self._call_id(), name, self._input(name)))
        if not calls and text is None:
            text = "Done. " + sentence(rng, "the change")
        return Step(thinking, text, calls)

    def _input(self, name: str) -> dict[str, Any]:
        rng = self.rng
        path = rng.choice(self.files)
        n, f, c = ident(rng)
        if name == "Read":
            return {"file_path": path}
        if name == "Bash":
            cmd, desc = rng.choice(
                (
                    (f"python -m pytest tests/test_{n}.py -x -q", "Run the tests"),
                    ("git status --short && git diff --stat", "Show changed files"),
                    ("make lint", "Run the linters"),
                    (f"ls -la {self.cwd}/src", "List source files"),
                    ("npm test -- --silent", "Run the test suite"),
                )
            )
            return {"command": cmd, "description": desc}
        if name == "Grep":
            return {"pattern": f, "path": self.cwd, "output_mode": "content", "-n": True}
        if name == "Glob":
            return {"pattern": "**/*." + ("py" if self.lang == "py" else "ts"), "path": self.cwd}
        if name in ("Edit", "MultiEdit", "Write"):
            self.touched.append(path)
            pool = code_pool(self.lang)
            old = "\n".join(take(pool, rng, rng.randint(40, 300)))
            new = "\n".join(take(pool, rng, rng.randint(40, 300)))
            if name == "Edit":
                return {"file_path": path, "old_string": old, "new_string": new}
            if name == "MultiEdit":
                return {"file_path": path, "edits": [{"old_string": old, "new_string": new}]}
            return {
                "file_path": path,
                "content": "\n".join(take(pool, rng, rng.randint(300, 3000))),
            }
        if name == "TodoWrite":
            k = rng.randint(2, 5)
            done = rng.randint(0, k - 1)
            todos = []
            for i in range(k):
                status = "completed" if i < done else ("in_progress" if i == done else "pending")
                what = f"{rng.choice(VERBS).capitalize()} the {rng.choice(NOUNS)} handling"
                todos.append({"content": what, "status": status, "activeForm": what + " (working)"})
            return {"todos": todos}
        if name == "WebFetch":
            return {
                "url": f"https://docs.example.org/{n}/{f.replace('_', '-')}",
                "prompt": f"How does {c} handle {rng.choice(NOUNS)} limits?",
            }
        return {  # Agent
            "description": f"Survey {n} usage",
            "prompt": f"Find every place that calls {f} in {self.cwd} and report the call "
            f"sites with a one-line note each. Do not change any files.",
            "subagent_type": "general-purpose",
        }

    def result(self, call: Call) -> Result:
        rng = self.rng
        lo, hi = self.spec.tool_result_chars
        size = loguniform(rng, lo, hi)
        name = call.name
        as_list = name in ("Agent", "WebFetch") or rng.random() < 0.1
        if rng.random() < 0.07:
            text = {
                "Read": "File does not exist. Current working directory: " + self.cwd,
                "Edit": "String to replace not found in file.\nString: "
                + call.input.get("old_string", "")[:80],
                "MultiEdit": "String to replace not found in file.",
            }.get(name)
            if text is None:
                text = "Exit code 1\n" + "\n".join(take(log_pool(), rng, min(size, 1500)))
            return Result(call.id, text, True, as_list)
        if name == "Read":
            lines = take(code_pool(self.lang), rng, size)
            first = rng.randint(1, 400)
            text = "\n".join(f"{first + i:>6}\t{line}" for i, line in enumerate(lines))
        elif name == "Bash":
            text = "\n".join(take(log_pool(), rng, size))
        elif name == "Grep":
            pool = code_pool(self.lang)
            lines = take(pool, rng, size)
            text = "\n".join(
                f"{rng.choice(self.files)}:{rng.randint(1, 900)}:{line.strip()}" for line in lines
            )
        elif name == "Glob":
            text = "\n".join(self.files)
        elif name in ("Edit", "MultiEdit", "Write"):
            verb = "created" if name == "Write" else "updated"
            text = f"The file {call.input['file_path']} has been {verb} successfully."
        elif name == "TodoWrite":
            text = (
                "Todos have been modified successfully. Keep using the todo list to track "
                "progress, and continue with the current task."
            )
        else:  # Agent, WebFetch
            text = prose(rng, size, "the module")
        return Result(call.id, text, False, as_list)

    def reminder(self) -> str | None:
        if self.rng.random() < 0.1:
            return (
                "<system-reminder>\nThe task list has not been updated recently. If it is "
                "still relevant, update it; otherwise ignore this reminder.\n</system-reminder>"
            )
        return None

    def followup(self) -> str:
        return self.rng.choice(_FOLLOWUPS)

    def summary(self, epoch: int) -> str:
        rng = self.rng
        files = ", ".join(sorted(set(self.touched))[-6:]) or "none yet"
        return (
            f"<summary>\n1. Primary request: {self.task}\n2. Key concepts: "
            f"{prose(rng, 400, 'the cache layer')}\n3. Files changed so far: {files}\n"
            f"4. Errors and fixes: {prose(rng, 300, 'the test run')}\n5. Pending: finish the "
            f"remaining steps and re-run the tests.\n6. Context window {epoch + 1} resumes "
            "here.\n</summary>"
        )
