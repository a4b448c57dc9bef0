"""Device and dtype: resolution rules, the fast path's tensors on the weights' device, bfloat16 end to end."""

import pytest
import torch

from relaxspec.cli import main
from relaxspec.engine import generate
from relaxspec.models import load_model
from relaxspec.models.device import resolve_device, resolve_dtype
from relaxspec.models.fast_llama import FastLlama
from relaxspec.models.hf import CausalLM
from relaxspec.tasks import synthetic


def test_device_and_dtype_resolution(monkeypatch):
    monkeypatch.delenv("RELAXSPEC_DEVICE", raising=False)
    monkeypatch.delenv("RELAXSPEC_DTYPE", raising=False)
    default = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device(None).type == default
    assert resolve_device("cpu") == resolve_device(torch.device("cpu")) == torch.device("cpu")
    monkeypatch.setenv("RELAXSPEC_DEVICE", "cpu")
    assert resolve_device(None) == torch.device("cpu")
    for bad, message in [("gpu", "unknown device"), ("tpu:0", "unknown device")]:
        with pytest.raises(ValueError, match=message):
            resolve_device(bad)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda:0")
    if not torch.backends.mps.is_available():
        with pytest.raises(ValueError, match="MPS is not available"):
            resolve_device("mps")
    assert resolve_dtype(None, torch.device("cpu")) == torch.float32
    assert resolve_dtype(None, torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("bfloat16") == resolve_dtype(torch.bfloat16) == torch.bfloat16
    assert resolve_dtype("torch.float16") == torch.float16
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("float8")
    monkeypatch.setenv("RELAXSPEC_DTYPE", "float16")
    assert resolve_dtype(None, torch.device("cpu")) == torch.float16 and resolve_dtype("float32") == torch.float32
    with pytest.raises(ValueError, match="unsupported dtype"):
        resolve_dtype(torch.int8)


def test_causal_lm_reports_device_dtype_and_context_and_returns_float32():
    lm = load_model("verifier", device="cpu", dtype="bfloat16")
    assert (lm.device, lm.dtype, lm.max_position_embeddings, lm.backend) == (torch.device("cpu"), torch.bfloat16,
                                                                             512, "fast")
    ids = torch.tensor([lm.tokenizer("Compute 12 + 7.")["input_ids"]])
    logits, hidden = lm.forward(ids, lm.new_cache(), torch.ones_like(ids), torch.arange(ids.shape[1])[None],
                                hidden_layer=2)
    assert logits.dtype == hidden.dtype == torch.float32
    # Same weights in float32: bfloat16 rounding moves the logits a little, not the greedy choices.
    fp32 = load_model("verifier", device="cpu", dtype="float32")
    ref, _ = fp32.forward(ids, fp32.new_cache(), torch.ones_like(ids), torch.arange(ids.shape[1])[None])
    assert (logits - ref).abs().max() < 0.5
    assert torch.equal(logits.argmax(-1), ref.argmax(-1))


def test_fast_path_creates_every_tensor_on_the_weights_device():
    # On the meta device any tensor made on the default (CPU) device meets a meta one and raises.
    model = load_model("verifier", device="cpu", backend="transformers").model.to("meta")
    lm = CausalLM("verifier", model, None, FastLlama(model))
    assert lm.device.type == "meta"
    cache = lm.new_cache()
    ids = torch.zeros((2, 5), dtype=torch.long, device="meta")
    mask = torch.ones((2, 5), dtype=torch.long, device="meta")
    logits, hidden = lm.forward(ids, cache, mask, torch.arange(5, device="meta")[None].expand(2, 5), hidden_layer=1)
    assert logits.device.type == "meta" and logits.shape == (2, 5, 714) and hidden.shape == (2, 5, 128)
    more = torch.ones((2, 7), dtype=torch.long, device="meta")  # two more tokens: the masked path
    logits, _ = lm.forward(ids[:, :2], cache, more, torch.arange(5, 7, device="meta")[None].expand(2, 2))
    assert logits.device.type == "meta" and logits.shape == (2, 2, 714)
    cache.batch_select_indices(torch.tensor([1], device="meta"))


def test_strict_greedy_equals_ar_greedy_in_bfloat16():
    verifier = load_model("verifier", device="cpu", dtype="bfloat16")
    drafter = load_model("drafter-weak", device="cpu", dtype="bfloat16")
    prompts = synthetic.synthetic_task("arithmetic", "test", 3).prompts
    ar = generate(verifier, None, prompts, method="ar", max_new_tokens=40)
    strict = generate(verifier, drafter, prompts, method="strict", draft_length=4, max_new_tokens=40)
    assert [r.token_ids for r in strict.results] == [r.token_ids for r in ar.results]
    assert all(len(r.token_ids) > 10 for r in ar.results)


def test_generate_cli_runs_the_builtin_pair_in_bfloat16(capsys):
    prompt = synthetic.examples("arithmetic", "test", 1)[0].prompt
    assert main(["generate", "--prompt", prompt, "--dtype", "bfloat16", "--device", "cpu",
                 "--max-new-tokens", "30"]) == 0
    out = capsys.readouterr()
    assert len(out.out.strip()) > 10 and "[strict] 30 tokens" in out.err


def test_hub_ids_load_from_the_local_hugging_face_cache_offline(tmp_path):
    # A Hugging Face cache laid out as huggingface_hub writes it, holding a copy of a built-in model.
    import shutil
    import subprocess
    import sys

    from relaxspec.models import builtin_path

    repo = tmp_path / "hub" / "models--acme--tiny"
    snapshot = repo / "snapshots" / ("0" * 40)
    shutil.copytree(builtin_path("drafter-weak"), snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    code = ("import sys; from relaxspec.models import load_model; from relaxspec.cli import main;"
            "lm = load_model('acme/tiny', device='cpu'); print(lm.num_parameters(), lm.backend);"
            "print(main(['generate', '--verifier', 'acme/absent', '--method', 'ar', '--prompt', 'hi']))")
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": ":".join(sys.path)}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [str(load_model("drafter-weak", device="cpu").num_parameters()), "fast", "2"]
    # A hub id that is not in the cache: one line, nothing downloaded.
    assert run.stderr.startswith("relaxspec: error: cannot load model 'acme/absent'") and \
        run.stderr.count("\n") == 1 and "Traceback" not in run.stderr, run.stderr
