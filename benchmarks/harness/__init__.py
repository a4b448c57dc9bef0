"""What the benchmark scripts share, imported as `harness` (a script's own folder is first on sys.path):

* timing: configurations taking turns prompt by prompt (medians over prompts), a call's clock, the bench's speed
  constants of one verifier;
* llamacpp: the llama.cpp peer (llama-cpp-python on a GGUF file, llama.cpp's own speculative binary);
* peer: relaxspec against llama.cpp on one GGUF file per weight format (the configurations, the runs, the greedy
  divergences), as cpu_peer.py and real_pair_peer.py measure it;
* output: markdown tables, notes and CSV;
* options: command-line options the scripts share.

Each module imports torch, transformers and relaxspec only where a function needs them.
"""
