import json

from relaxspec.acceptance import RULES
from relaxspec.cli import main
from relaxspec.cli.generate import parse_params, render_trace
from relaxspec.engine import generate
from relaxspec.tasks import synthetic

PROMPT = synthetic.examples("arithmetic", "test", 1)[0].prompt


def relaxspec(capfd, *args):
    """`relaxspec ARGS` in this process (main(), as `python -m relaxspec` runs it; a real process's stdout and exit
    code: test_cli_errors.py): (exit code, stdout, stderr), the output read at the file descriptors."""
    code = main(list(args))
    out, err = capfd.readouterr()
    return code, out, err


def test_generate_json_is_one_object_with_the_documented_fields(capfd):
    code, stdout, err = relaxspec(capfd, "generate", "--prompt", PROMPT, "--method", "cactus", "--param", "delta=0.25",
                                  "--temperature", "0.7", "--max-new-tokens", "24", "--json")
    assert code == 0, err
    data = json.loads(stdout)
    keys = {"draft_length", "sequences", "sequence_rounds", "drafts_proposed", "drafts_accepted", "drafts_cut",
            "emitted_tokens", "accepted_per_position",
            "proposed_per_position",
            "acceptance_rate", "acceptance_rate_per_position", "mean_acceptance_length", "generated_tokens",
            "verifier_forwards", "drafter_forwards", "time_draft_s", "time_verify_s", "time_total_s",
            "phase_relaxed_positions", "rule_state"}
    assert set(data["stats"]) == keys
    (result,) = data["results"]
    batch_only = {"verifier_forwards", "drafter_forwards", "time_draft_s", "time_verify_s", "time_total_s",
                  "phase_relaxed_positions"}
    assert result["prompt"] == PROMPT and set(result["stats"]) == keys - batch_only and isinstance(result["seed"], int)
    assert 0 < len(result["token_ids"]) <= 24
    assert len(result["stats"]["acceptance_rate_per_position"]) == 5


def test_methods_lists_every_rule_with_parameters(capfd):
    code, stdout, err = relaxspec(capfd, "methods", "--json")
    assert code == 0, err
    listed = json.loads(stdout)
    assert set(listed) == set(RULES)
    assert listed["mentored"]["params"]["alpha"]["grid"] == [0.3, 0.7, 0.95]
    assert listed["cactus"]["strict"] == {"delta": 0.0}


def test_bad_input_is_a_clear_error_with_exit_code_2(capfd):
    for args, message in [(["--method", "nope"], "unknown acceptance method"),
                          (["--method", "mentored", "--param", "alpha=1.5"], "alpha"),
                          (["--param", "oops"], "KEY=VALUE")]:
        code, _, err = relaxspec(capfd, "generate", "--prompt", PROMPT, "--max-new-tokens", "4", *args)
        assert code == 2 and message in err, err
    code, _, err = relaxspec(capfd, "generate", "--prompt", "", "--max-new-tokens", "4")
    assert code == 2 and "empty" in err


def test_show_marks_accepted_rejected_and_relaxed_tokens(builtin_pair):
    verifier, drafter = builtin_pair
    out = generate(verifier, drafter, [PROMPT], method="ensemble", weight=0.5, temperature=0.7,
                   max_new_tokens=60, seed=0)
    (result,) = out.results
    shown = render_trace(result, verifier.tokenizer, color=False)
    assert "[-" in shown and "{" in shown  # some drafts rejected, some accepted only thanks to the relaxation
    stripped = shown
    import re
    stripped = re.sub(r"\[-.*?-\]>", "", stripped)  # drop rejected drafts, keep their replacements
    stripped = re.sub(r"[{}<>]", "", stripped)
    assert stripped == result.text or result.text.startswith(stripped[: len(result.text)])


def test_parse_params():
    assert parse_params(["alpha=0.5", "top=3", "classifier=a.pt", "flag=true"]) == {
        "alpha": 0.5, "top": 3, "classifier": "a.pt", "flag": True}
