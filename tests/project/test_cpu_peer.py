"""benchmarks/cpu_peer.py's reduced mode (what CI runs, without llama.cpp): every format's rows and constants."""

from pathlib import Path

from conftest import benchmark_module

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "cpu_peer.py"


def test_cpu_peer_quick_mode_prints_every_format(forker):  # (forker: this tree's src first)
    out = forker.run([SCRIPT, "--quick", "--no-progress"], cwd=SCRIPT.parents[1], timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in out.stdout.splitlines() if line.startswith("| 1 |")]
    assert {(r[2].strip(), r[3].strip(), r[4].strip()) for r in rows} == {
        (fmt, method, drafter) for fmt in ("float32", "bfloat16", "int4")
        for method, drafter in (("ar", "-"), ("strict", "drafter-mtp"), ("strict", "ngram"))}
    for r in rows:
        assert float(r[6]) > 0  # ms/token
        if r[3].strip() == "strict":  # tau, c_rel, c_block, modelled, measured/modelled all measured
            assert all(float(x) > 0 for x in r[9:14]), r
    for fmt in ("float32", "bfloat16", "int4"):
        assert f"1 thread(s), {fmt}: verifier step" in out.stdout and "6 tokens" in out.stdout
        assert f"greedy, {fmt}: 0 of 4 strict runs differ from AR" in out.stdout
    assert "llama.cpp: not run" in out.stdout


def test_peak_rss_is_the_fresh_process_own_memory():
    """peak_rss_mb reads the child's VmHWM: ru_maxrss would also count the parent's resident memory at the fork
    (Linux carries the forked copy's high-water mark across exec), here a 1.6 GB tensor the child never touches."""
    import torch

    cpu_peer = benchmark_module("cpu_peer")
    ballast = torch.ones(400_000_000)  # 1.6 GB resident in this process
    for args in (("verifier", "float32", "drafter-weak"), ("verifier", "int4")):  # strict, AR
        peak, after = cpu_peer.peak_rss_mb(*args)
        assert 100 < after <= peak < 1200, (args, peak, after)  # torch + transformers + a tiny model, no ballast
    assert float(ballast[-1]) == 1.0
