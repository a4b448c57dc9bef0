"""The docs cannot rot: every runnable block of README.md and docs/*.md runs, the layout map names every module,
the README's test command is CI's, and the docs, code and tests speak of the project only as it is.

Runnable blocks (docs/design.md, "Documentation"): fences marked `bash` or `python`; a block preceded by
`<!-- not run: REASON -->` is listed apart. Each page's blocks run in order in one process of its own (a driver
script, forked from one that imported torch and transformers once: tests/forked.py), in a scratch directory: a
`relaxspec ...` command through `relaxspec.cli.main` in that process (one import of torch for all the pages instead
of one per command), any other command through `bash -c`, a Python block by `exec` in a fresh namespace. Before running, `TINY` makes each command small (arguments appended: argparse keeps
the last value) and Python blocks get `max_new_tokens=4` and tune's small search; a flag or name the code no longer
has still fails.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "relaxspec"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(?P<reason>[^>]*?)\s*-->\s*$", re.MULTILINE)  # a line of its own

# Arguments appended to a `relaxspec` command, by its subcommand, unless the command already gives the flag.
TINY: dict[tuple[str, ...], list[str]] = {
    ("bench",): ["--methods", "ar,strict", "--draft-lengths", "3", "--limit", "2", "--looks", "1",
                 "--speed-prompts", "0", "--max-new-tokens", "4", "--workers", "1", "--no-plots", "--no-progress"],
    ("tune",): ["--methods", "strict,typical", "--draft-lengths", "3", "--search-prompts", "4", "--heldout-prompts",
                "4", "--rungs", "2,4", "--caps", "4", "--max-new-tokens", "4", "--no-plots", "--no-progress"],
    ("generate",): ["--max-new-tokens", "4"],
    ("pivot", "label"): ["--prompts", "4", "--k", "2", "--max-new-tokens", "60"],  # whole answers: some pivots
    ("pivot", "train"): ["--epochs", "2"],
    ("drafter", "train"): ["--n", "4", "--steps", "2", "--max-new-tokens", "8"],
    ("models", "list"): ["--n", "2"],
}
# Always appended (they override a size the example gives): the tiny scale's sizes.
TINY_ALWAYS = {"--limit", "--max-new-tokens", "--n", "--steps", "--prompts", "--search-prompts", "--heldout-prompts"}
# Python blocks: `relaxspec.tune(` gets tune's small search (keyword arguments of relaxspec.tune).
TINY_TUNE_KWARGS = ('methods=["strict", "typical"], draft_lengths=[3], search_prompts=4, heldout_prompts=4, '
                    'sizes=(2, 4), caps=(4,), max_new_tokens=4, plots=False, ')


def fenced_blocks(text: str) -> list[dict]:
    """Every fenced block: its language, its code, the line it starts on and its not-run reason (None: it runs)."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        above = lines[start - 1] if start > 0 else ""
        reason = NOT_RUN.search(above)
        blocks.append({"lang": m.group(1), "code": "\n".join(body) + "\n", "line": start + 1,
                       "not_run": reason.group("reason") if reason else None})
        i += 1
    return blocks


def shell_commands(code: str) -> list[str]:
    """A bash block's commands: one per line; a trailing backslash or an open quote continues it."""
    commands, pending = [], ""
    for line in code.splitlines():
        pending = f"{pending}\n{line}" if pending else line
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the command goes on
            continue
        if shlex.split(pending, comments=True):
            commands.append(pending)
        pending = ""
    assert not pending, f"unterminated command: {pending!r}"
    return commands


def tiny(argv: list[str]) -> list[str]:
    """`relaxspec` argv (without the program name) at the tiny scale."""
    for key, extra in TINY.items():
        if tuple(argv[:len(key)]) == key:
            given = set(argv)
            out = list(argv)
            for j in range(0, len(extra), 2):
                flag = extra[j]
                has_value = j + 1 < len(extra) and not extra[j + 1].startswith("--")
                if flag in given and flag not in TINY_ALWAYS:
                    continue
                out += [flag, extra[j + 1]] if has_value else [flag]
            return out
    return argv


def steps_of(block: dict) -> list[dict]:
    if block["lang"] == "python":
        code = re.sub(r"max_new_tokens=\d+", "max_new_tokens=4", block["code"])
        code = code.replace("relaxspec.tune(", "relaxspec.tune(" + TINY_TUNE_KWARGS)
        return [{"kind": "python", "code": code, "line": block["line"]}]
    steps = []
    for command in shell_commands(block["code"]):
        for part in re.split(r"\s&&\s", command):
            words = shlex.split(part, comments=True)
            if words and words[0] == "relaxspec":
                steps.append({"kind": "cli", "argv": tiny(words[1:]), "line": block["line"]})
            else:
                steps.append({"kind": "sh", "command": part, "line": block["line"]})
    return steps


DRIVER = r"""
import contextlib, json, subprocess, sys, traceback
from relaxspec.cli import main
steps = json.load(open(sys.argv[1]))
for i, step in enumerate(steps):
    where = f"step {i + 1} (block at line {step['line']})"
    print(f"=== {where}: " + (" ".join(["relaxspec", *step["argv"]]) if step["kind"] == "cli"
                              else step.get("command", "<python block>")), flush=True)
    if step["kind"] == "cli":
        try:
            code = main(step["argv"])
        except SystemExit as e:
            code = e.code
        if code not in (0, None):
            print(f"FAILED {where}: exit {code}", flush=True)
            sys.exit(1)
    elif step["kind"] == "sh":
        if subprocess.run(["bash", "-c", step["command"]]).returncode != 0:
            print(f"FAILED {where}", flush=True)
            sys.exit(1)
    else:
        try:
            exec(compile(step["code"], f"<block at line {step['line']}>", "exec"), {"__name__": "__doc_block__"})
        except Exception:
            traceback.print_exc()
            print(f"FAILED {where}", flush=True)
            sys.exit(1)
"""


def runnable(page: Path) -> list[dict]:
    return [b for b in fenced_blocks(page.read_text(encoding="utf-8"))
            if b["lang"] in ("bash", "python") and b["not_run"] is None]


@pytest.mark.parametrize("page", [p for p in PAGES if runnable(p)], ids=lambda p: p.name)
def test_every_runnable_block_of_the_page_runs(page, tmp_path, forker):
    steps = [s for b in runnable(page) for s in steps_of(b)]
    (tmp_path / "steps.json").write_text(json.dumps(steps))
    (tmp_path / "driver.py").write_text(DRIVER)
    work = tmp_path / "work"
    work.mkdir()
    out = forker.run([tmp_path / "driver.py", tmp_path / "steps.json"], cwd=work, timeout=600)
    last_step = out.stdout[out.stdout.rfind("=== "):]  # the failing step's command and its output
    assert out.returncode == 0, f"{page.name}:\n{last_step[-4000:]}\n{out.stderr[-4000:]}"


def test_blocks_left_out_say_why_and_the_markers_sit_on_runnable_fences():
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        blocks = fenced_blocks(text)
        for b in blocks:
            if b["not_run"] is not None:
                assert b["not_run"].strip(), f"{page.name}:{b['line']}: a not-run marker without a reason"
                assert b["lang"] in ("bash", "python"), f"{page.name}:{b['line']}: marker on a block never run"
        markers = len(NOT_RUN.findall(text))
        assert markers == sum(b["not_run"] is not None for b in blocks), \
            f"{page.name}: a not-run marker that is not on the line just above a bash or python fence"


def test_tiny_scale_rewrites_commands():
    assert tiny(["bench", "--limit", "40"])[-2:] != ["--limit", "40"] and "--limit" in tiny(["bench"])
    argv = tiny(["bench", "--methods", "strict,cactus", "--limit", "40"])
    last_limit = len(argv) - 1 - argv[::-1].index("--limit")
    assert argv.count("--methods") == 1 and argv[last_limit + 1] == "2"  # argparse keeps the last value
    assert shell_commands('relaxspec generate --prompt "a\nb" --show\nrelaxspec methods  # x\n') == \
        ['relaxspec generate --prompt "a\nb" --show', "relaxspec methods  # x"]
    steps = steps_of({"lang": "bash", "code": "python3 -m venv .venv && relaxspec bench\n", "line": 1})
    assert [s["kind"] for s in steps] == ["sh", "cli"]


def readme_test_command() -> str:
    blocks = fenced_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    commands = [b["code"].strip() for b in blocks if "pytest" in b["code"]]
    assert len(commands) == 1, commands
    return commands[0]


def test_ci_runs_exactly_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()[-1]
    assert ci == readme_test_command()


def test_the_main_job_installs_only_what_it_needs():
    blocks = fenced_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    main_job = [b["code"].strip() for b in blocks if b["code"].strip().endswith("relaxspec bench")]
    assert main_job == ["python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/relaxspec bench"]


def layout_map() -> dict[str, set[str]]:
    """docs/design.md's Layout table: {package: {module file names}} ("relaxspec/" for the top package)."""
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    section = text.split("\n## Layout", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    table = {}
    for row in rows:
        cells = row.split("|")
        package = re.findall(r"`([^`]+)`", cells[1])[0]
        table[package] = set(re.findall(r"`([\w]+\.py)`", cells[2]))
    return table


def test_the_layout_map_names_every_package_and_module():
    tree = {}
    for init in SRC.rglob("__init__.py"):
        package = init.parent
        name = "relaxspec/" if package == SRC else package.relative_to(SRC).as_posix() + "/"
        tree[name] = {p.name for p in package.glob("*.py")}
    documented = layout_map()
    assert sorted(set(tree) - set(documented)) == [], "packages missing from docs/design.md's Layout"
    assert sorted(set(documented) - set(tree)) == [], "Layout names packages that do not exist"
    for package, modules in tree.items():
        assert sorted(modules - documented[package]) == [], f"{package}: modules missing from the Layout"
        assert sorted(documented[package] - modules) == [], f"{package}: Layout names modules that do not exist"


# "session" as the POSIX process session, a pytest fixture scope, a D-Bus session bus: the words of what the code
# does. Anything else (a sitting in which the project was worked on) is a record of how it was made.
LEGIT_SESSION = re.compile(r'scope="session"|"session"|\b(its|own|new|a new) session\b|session bus|setsid'
                           r'|session or environment|start_new_session', re.IGNORECASE)
MAKING = re.compile(r"\bsessions?\b", re.IGNORECASE)
WHO = re.compile(r"\b[Hh]elper [A-H]\b|\bthe helper's run\b")
SCANNED = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "docs", ROOT / "src", ROOT / "tests", ROOT / "benchmarks"]
SUFFIXES = {".md", ".py", ".sh", ".c", ".h", ".toml", ".txt"}


def test_the_project_speaks_of_itself_only():
    found = []
    for top in SCANNED:
        files = [top] if top.is_file() else [p for p in top.rglob("*") if p.is_file() and p.suffix in SUFFIXES
                                               and "__pycache__" not in p.parts and ".egg-info" not in str(p)]
        for path in files:
            if path == Path(__file__):
                continue
            previous = ""
            for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                joined = f"{previous} {line}"  # the previous line's last word: a phrase broken across lines
                cleaned = LEGIT_SESSION.sub(lambda m: " " * len(m.group()), joined)
                if MAKING.search(cleaned, len(previous) + 1) or WHO.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
                previous = (line.split() or [""])[-1]
    assert found == []


def test_benchmarks_readme_lists_every_script():
    readme = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `([\w.]+\.(?:py|sh))` \|", readme, re.MULTILINE))
    scripts = {p.name for p in (ROOT / "benchmarks").iterdir() if p.suffix in (".py", ".sh")}
    assert sorted(scripts - listed) == [], "scripts missing from benchmarks/README.md"
    assert sorted(listed - scripts) == [], "benchmarks/README.md lists scripts that do not exist"
