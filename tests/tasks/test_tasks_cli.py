import json
import os
import subprocess
import sys
from pathlib import Path

from relaxspec.cli import main
from relaxspec.tasks.benchmarks import BENCHMARKS

ROW = {"question": "Ann has 2 apples and buys 3. How many?", "answer": "2 + 3 = 5\n#### 5"}


def test_tasks_list(capsys):
    assert main(["tasks", "list"]) == 0
    out = capsys.readouterr().out
    for name in ["arithmetic", "sorting", "jsonl:PATH", *BENCHMARKS]:
        assert name in out
    assert "openai/gsm8k" in out and "Idavidrein/gpqa" in out


def test_tasks_show_template_and_examples(tmp_path, capsys):
    assert main(["tasks", "show", "gpqa"]) == 0  # on the hub: the template only, nothing loaded
    out = capsys.readouterr().out
    assert "Answer: X" in out and "{question}" in out and "example" not in out
    path = tmp_path / "gsm.jsonl"
    path.write_text(json.dumps(ROW) + "\n", encoding="utf-8")
    assert main(["tasks", "show", f"gsm8k:{path}"]) == 0
    out = capsys.readouterr().out
    assert "put your final answer within \\boxed{}" in out and "--- example 1 (reference: 5)" in out
    assert ROW["question"] in out
    assert main(["tasks", "show", f"gsm8k:{path}", "--prompt-template", "Q: {question}\nA:"]) == 0
    assert f"Q: {ROW['question']}\nA:" in capsys.readouterr().out
    assert main(["tasks", "show", "arithmetic", "--examples", "2"]) == 0
    assert capsys.readouterr().out.count("--- example") == 2


def test_tasks_show_errors_are_one_line(tmp_path, capsys):
    assert main(["tasks", "show", f"gsm8k:{tmp_path / 'missing.jsonl'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("relaxspec: error: dataset file") and err.count("\n") == 1
    assert main(["tasks", "show", "gsm8k", "--prompt-template", "no placeholder"]) == 2
    assert "placeholder" in capsys.readouterr().err


def test_hub_loading_offline_is_one_clear_line(tmp_path):
    """The real `datasets.load_dataset` path, with the hub unreachable (offline mode, empty cache)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "RELAXSPEC_CACHE": str(tmp_path),
           "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    proc = subprocess.run([sys.executable, "-m", "relaxspec", "tasks", "show", "gsm8k", "--examples", "1"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    last = proc.stderr.strip()
    assert last.startswith("relaxspec: error: could not load gsm8k from the hub (openai/gsm8k")
    assert "give a local file: gsm8k:PATH" in last
