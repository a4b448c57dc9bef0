"""HumanEval as instruct models are evaluated (EvalPlus's instruct convention): `humaneval-instruct`.

The prompt is one user turn: EvalPlus's instruction, then the problem's prompt (stripped) in a fenced block:

    Please provide a self-contained Python script that solves the following problem in a markdown code block:
    ```
    <the problem's prompt>
    ```

The engine applies the model's chat template to it (chat_template "auto": for Qwen2.5 its default system turn,
the user turn, then `<|im_start|>assistant\\n`) and generation stops at the tokenizer's end-of-turn token
(`<|im_end|>` for Qwen), up to `MAX_NEW_TOKENS` new tokens.

The assistant's turn is not prefilled. EvalPlus prefills chat models with RESPONSE_PREFIX and an opening
```python fence, and also stops at a closing fence; a task here is text templated by whichever model runs it
(bench, tune and generate share one path), so it cannot hold a model's assistant-turn markers, and the engine
stops at the end-of-turn token only. The model writes its own fence; the answer may go on after the block.

Scoring: `answer_code` takes the first ```python block (else the first fenced block, an unclosed fence running to
the end of the response, else the whole response), `sanitize` keeps its imports, definitions and assignments
(an example `print`, a `__main__` block or the model's own asserts are dropped, as EvalPlus's sanitizer drops
them), and the existing HumanEval scorer runs the prompt, that code and the problem's tests in the sandbox
(passed only on the harness's token, never an exit status).
"""

from __future__ import annotations

import ast
import re

INSTRUCTION = ("Please provide a self-contained Python script that solves the following problem in a markdown "
               "code block:")
RESPONSE_PREFIX = ("Below is a Python script with a self-contained function that solves the problem and passes "
                   "corresponding tests:")  # EvalPlus's prefill for chat models; not sent (see the module doc)
TEMPLATE = INSTRUCTION + "\n```\n{question}\n```\n"
MAX_NEW_TOKENS = 512

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:\n[ \t]*```|\Z)", re.DOTALL)
_PYTHON = ("python", "py", "python3")


def answer_code(response: str) -> str:
    """The code of an answer: the first ```python block; else the first fenced block of any language; an
    unclosed fence runs to the end; no fence at all: the whole response."""
    blocks = _FENCE.findall(response)
    for lang, body in blocks:
        if lang.lower() in _PYTHON:
            return body
    return blocks[0][1] if blocks else response


def _kept(node: ast.stmt) -> bool:
    if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                         ast.Assign, ast.AnnAssign)):
        return True
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)  # a docstring / string literal


def sanitize(code: str) -> str:
    """`code`'s top-level imports, function and class definitions and assignments, in order; the other top-level
    statements (calls, prints, loops, asserts, `if __name__ == "__main__":`) dropped. Code that does not parse is
    returned as it is (it fails in the sandbox, as it would run)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return code
    lines = code.splitlines()
    parts = []
    for node in tree.body:
        if not _kept(node):
            continue
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        parts.append("\n".join(lines[first - 1:node.end_lineno]))
    return "\n".join(parts) + "\n" if parts else code


def scored_code(response: str) -> str:
    """What the sandbox runs after the problem's prompt for this response (see the module doc)."""
    return sanitize(answer_code(response))
