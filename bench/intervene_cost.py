"""Activation patching cost: one GPT-2 block's output patched from a clean run, as a ratio to a plain forward.

    python bench/intervene_cost.py --repeats 15

GPT-2 small (12 layers, 768 wide, random weights), 64 tokens, one thread,
no grad. Each round times, interleaved: a plain forward on the corrupted
tokens; the patched capture (``save=`` and ``intervene=`` on block
``h.6``: that block's output swapped for the clean run's); a hooked forward
doing the same patch by hand, the cheapest way to get the patched output.
Medians; the clean run is captured once, outside the timing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--block", type=int, default=6)
    options = parser.parse_args()

    import torch
    import transformers

    import torchlens as tl

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = transformers.GPT2Config()
    model = transformers.GPT2Model(config).eval()
    clean_ids = torch.randint(0, config.vocab_size, (1, 64))
    corrupted_ids = clean_ids.clone()
    corrupted_ids[0, 10:14] = torch.randint(0, config.vocab_size, (4,))
    site = tl.module(f"h.{options.block}")
    block = model.h[options.block]

    with torch.no_grad():
        clean = tl.trace(model, input_ids=clean_ids, save=site)
        clean_out = clean[f"h.{options.block}"].out

        def patched() -> object:
            return tl.trace(model, input_ids=corrupted_ids, save=site, intervene=tl.when(site, tl.swap_with(clean)))

        def hooked() -> object:
            handle = block.register_forward_hook(lambda m, a, out: clean_out)
            try:
                return model(input_ids=corrupted_ids)
            finally:
                handle.remove()

        expected = hooked().last_hidden_state
        assert torch.equal(patched().output.last_hidden_state, expected), "patched capture differs from the hook"
        plain_t, patched_t, hooked_t = [], [], []
        for _ in range(3):
            model(input_ids=corrupted_ids), patched(), hooked()
        for _ in range(options.repeats):
            t0 = time.perf_counter()
            model(input_ids=corrupted_ids)
            t1 = time.perf_counter()
            patched()
            t2 = time.perf_counter()
            hooked()
            t3 = time.perf_counter()
            plain_t.append(t1 - t0)
            patched_t.append(t2 - t1)
            hooked_t.append(t3 - t2)
    p, q, h = (statistics.median(t) * 1e3 for t in (plain_t, patched_t, hooked_t))
    print(f"torch {torch.__version__}, GPT-2 small, 64 tokens, 1 thread, median of {options.repeats} interleaved runs")
    print(f"plain forward          {p:8.1f} ms  1.00x")
    print(f"hooked patch           {h:8.1f} ms  {h / p:.2f}x")
    print(f"tl.trace patch (save=) {q:8.1f} ms  {q / p:.2f}x")


if __name__ == "__main__":
    main()
