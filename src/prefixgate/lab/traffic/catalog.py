"""The tool catalogue: Claude Code's tool definitions, and the subset the stable agent
uses under opencode-style names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def _p(kind: str, desc: str, **extra: Any) -> dict[str, Any]:
    return {"description": desc, "type": kind, **extra}


@dataclass(frozen=True)
class ToolDef:
    name: str
    weight: float
    description: str
    properties: dict[str, Any]
    required: tuple[str, ...]


_TODO_ITEM = {
    "type": "object",
    "properties": {
        "content": {"type": "string", "minLength": 1},
        "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]},
        "activeForm": {"type": "string", "minLength": 1},
    },
    "required": ["content", "status", "activeForm"],
    "additionalProperties": False,
}

CATALOG: tuple[ToolDef, ...] = (
    ToolDef(
        "Agent",
        8,
        "Start a sub-agent that works on a self-contained task on its own and reports back "
        "once. Give it everything it needs in the prompt: it cannot see this conversation.",
        {
            "description": _p("string", "A three-to-five word label for the task"),
            "prompt": _p("string", "The full task for the agent to perform"),
            "subagent_type": _p("string", "Which kind of agent to start"),
            "run_in_background": _p("boolean", "Return at once and notify when the agent is done"),
        },
        ("description", "prompt"),
    ),
    ToolDef(
        "Bash",
        8,
        "Run a command in a persistent bash shell. The working directory persists between "
        "calls; environment changes do not. Use it for builds, tests, git and other terminal "
        "work, not for reading or editing files, which have dedicated tools.",
        {
            "command": _p("string", "The command to run"),
            "timeout": _p("number", "Optional timeout in milliseconds (at most 600000)"),
            "description": _p(
                "string", "What the command does, in five to ten words of active voice"
            ),
            "run_in_background": _p("boolean", "Run the command in the background"),
        },
        ("command",),
    ),
    ToolDef(
        "BashOutput",
        1,
        "Fetch new output from a shell started with run_in_background.",
        {
            "bash_id": _p("string", "The id of the background shell"),
            "filter": _p("string", "Optional regular expression; only matching lines are returned"),
        },
        ("bash_id",),
    ),
    ToolDef(
        "KillShell",
        0.5,
        "Stop a background shell by its id.",
        {"shell_id": _p("string", "The id of the shell to stop")},
        ("shell_id",),
    ),
    ToolDef(
        "Glob",
        1.5,
        'Find files by name with a glob pattern such as "src/**/*.ts". Results are sorted '
        "by modification time, newest first.",
        {
            "pattern": _p("string", "The glob pattern to match"),
            "path": _p("string", "Directory to search in; defaults to the working directory"),
        },
        ("pattern",),
    ),
    ToolDef(
        "Grep",
        3,
        "Search file contents with a regular expression (ripgrep syntax). Prefer it over "
        "running grep or rg through Bash.",
        {
            "pattern": _p("string", "The regular expression to search for"),
            "path": _p("string", "File or directory to search in"),
            "glob": _p("string", "Only search files matching this glob"),
            "type": _p("string", "Only search files of this type, e.g. py or rust"),
            "output_mode": _p(
                "string",
                "What to return",
                enum=["content", "files_with_matches", "count"],
            ),
            "-i": _p("boolean", "Case-insensitive search"),
            "-n": _p("boolean", "Show line numbers (content mode)"),
            "-A": _p("number", "Lines of context after each match"),
            "-B": _p("number", "Lines of context before each match"),
            "-C": _p("number", "Lines of context around each match"),
            "head_limit": _p("number", "Return at most this many results"),
            "multiline": _p("boolean", "Let patterns span lines"),
        },
        ("pattern",),
    ),
    ToolDef(
        "Read",
        2.5,
        "Read a file from the local filesystem. Lines are returned numbered, starting at 1. "
        "Long files can be read in parts with offset and limit.",
        {
            "file_path": _p("string", "Absolute path of the file to read"),
            "offset": _p("number", "Line number to start at"),
            "limit": _p("number", "Number of lines to read"),
        },
        ("file_path",),
    ),
    ToolDef(
        "Edit",
        2,
        "Replace an exact string in a file. The edit fails if old_string is not unique, "
        "unless replace_all is set. Read the file first.",
        {
            "file_path": _p("string", "Absolute path of the file to change"),
            "old_string": _p("string", "The text to replace"),
            "new_string": _p("string", "The replacement text"),
            "replace_all": _p("boolean", "Replace every occurrence", default=False),
        },
        ("file_path", "old_string", "new_string"),
    ),
    ToolDef(
        "MultiEdit",
        2,
        "Apply several exact-string edits to one file in a single atomic step.",
        {
            "file_path": _p("string", "Absolute path of the file to change"),
            "edits": _p(
                "array",
                "The edits, applied in order",
                items={
                    "type": "object",
                    "properties": {
                        "old_string": {"type": "string"},
                        "new_string": {"type": "string"},
                        "replace_all": {"type": "boolean"},
                    },
                    "required": ["old_string", "new_string"],
                    "additionalProperties": False,
                },
                minItems=1,
            ),
        },
        ("file_path", "edits"),
    ),
    ToolDef(
        "Write",
        1.5,
        "Write a whole file, replacing it if it exists. Prefer Edit for existing files.",
        {
            "file_path": _p("string", "Absolute path of the file to write"),
            "content": _p("string", "The full content of the file"),
        },
        ("file_path", "content"),
    ),
    ToolDef(
        "NotebookEdit",
        1.5,
        "Replace, insert or delete one cell of a Jupyter notebook.",
        {
            "notebook_path": _p("string", "Absolute path of the .ipynb file"),
            "cell_id": _p("string", "The id of the cell to change"),
            "new_source": _p("string", "The new source of the cell"),
            "cell_type": _p("string", "The cell type", enum=["code", "markdown"]),
            "edit_mode": _p("string", "What to do", enum=["replace", "insert", "delete"]),
        },
        ("notebook_path", "new_source"),
    ),
    ToolDef(
        "WebFetch",
        2,
        "Fetch a URL, convert the page to markdown and answer a question about it with a "
        "small model. Read-only.",
        {
            "url": _p("string", "The URL to fetch", format="uri"),
            "prompt": _p("string", "What to extract from the page"),
        },
        ("url", "prompt"),
    ),
    ToolDef(
        "WebSearch",
        2,
        "Search the web and return result titles, links and snippets.",
        {
            "query": _p("string", "The search query", minLength=2),
            "allowed_domains": _p("array", "Only include these domains", items={"type": "string"}),
            "blocked_domains": _p("array", "Never include these domains", items={"type": "string"}),
        },
        ("query",),
    ),
    ToolDef(
        "TodoWrite",
        5,
        "Create and update a structured task list for the current session, so progress is "
        "visible to the user. Keep exactly one item in progress at a time.",
        {"todos": _p("array", "The updated task list", items=_TODO_ITEM)},
        ("todos",),
    ),
    ToolDef(
        "ExitPlanMode",
        1.5,
        "Leave plan mode and present the plan to the user for approval.",
        {"plan": _p("string", "The plan, in concise markdown")},
        ("plan",),
    ),
    ToolDef(
        "AskUserQuestion",
        3,
        "Ask the user one to four multiple-choice questions when a decision is theirs to make.",
        {
            "questions": _p(
                "array",
                "The questions to ask",
                items={
                    "type": "object",
                    "properties": {
                        "question": {"type": "string"},
                        "header": {"type": "string", "maxLength": 12},
                        "options": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "label": {"type": "string"},
                                    "description": {"type": "string"},
                                },
                                "required": ["label", "description"],
                            },
                            "minItems": 2,
                            "maxItems": 4,
                        },
                        "multiSelect": {"type": "boolean"},
                    },
                    "required": ["question", "header", "options", "multiSelect"],
                },
                minItems=1,
                maxItems=4,
            ),
        },
        ("questions",),
    ),
    ToolDef(
        "Skill",
        2,
        "Load a skill: a packaged set of instructions for a specialised task.",
        {
            "skill": _p("string", "The name of the skill"),
            "args": _p("string", "Optional arguments for the skill"),
        },
        ("skill",),
    ),
    ToolDef(
        "ToolSearch",
        1.5,
        "Look up deferred tools by keyword and load their schemas.",
        {
            "query": _p("string", "Keywords, or select:<name>[,<name>...]"),
            "max_results": _p("number", "How many tools to return", default=5),
        },
        ("query",),
    ),
    ToolDef(
        "ListMcpResourcesTool",
        0.5,
        "List the resources offered by the configured MCP servers.",
        {"server": _p("string", "Only list resources of this server")},
        (),
    ),
    ToolDef(
        "ReadMcpResourceTool",
        0.5,
        "Read one resource from an MCP server.",
        {
            "server": _p("string", "The MCP server name"),
            "uri": _p("string", "The resource URI"),
        },
        ("server", "uri"),
    ),
)
BY_NAME = {t.name: t for t in CATALOG}

# The stable agent's tools: a subset of the catalogue under opencode-style names.
STABLE_NAMES = {
    "Bash": "bash",
    "Read": "read",
    "Write": "write",
    "Edit": "edit",
    "Glob": "glob",
    "Grep": "grep",
    "WebFetch": "webfetch",
    "TodoWrite": "todowrite",
    "Agent": "task",
    "MultiEdit": "multiedit",
}
