"""Issue 41 on the GPU machine: what "right" means for programs of the CUDA backend, judged as
composer's proof judges (composer.run.accuracy: RMSE against fp64 beside eager's), in
ExecuTorch's own C++ runtime (bench/et_runtime's runner, named by $COMPOSER_ET_RUNNER).

Cases (``--cases``, comma-separated):

- ``plain_bf16``: a 4-layer bf16 transformer encoder (nn.TransformerEncoderLayer, d 256, vocab
  2048, sequence 2..256 dynamic) lowered by plain ExecuTorch (``CudaPartitioner``), run at
  lengths 3, 16, 200 and judged;
- ``composer_bf16``: the same through ``composer.compose(..., "cuda")``: its proof, repairs and
  time (the time bound is ``repair_time``);
- ``composer_fp32_mixed``: the encoder in fp32 with ``xnnpack,cuda``, proven at every size,
  and run again at length 3.

One JSON object a line on stdout (``case``, figures, seconds); run on the GPU machine:

    COMPOSER_ET_RUNNER=/tmp/etb/build/composer_runner/composer_et_runner \\
        python3 bench/gpu/gpu_proof.py --cases plain_bf16,composer_bf16,composer_fp32_mixed
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
import traceback

import torch
from torch import nn

LENGTHS = (3, 16, 200)


class Encoder(nn.Module):
    def __init__(self, vocab: int = 2048, dim: int = 256, layers: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, 8, 4 * dim, batch_first=True) for _ in range(layers)
        )
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def encoder(dtype: torch.dtype) -> tuple[nn.Module, torch.export.ExportedProgram, torch.Tensor]:
    torch.manual_seed(0)
    model = Encoder().eval().to(dtype)
    tokens = torch.randint(0, 2048, (1, 16))
    seq = torch.export.Dim("seq", min=2, max=256)
    with torch.no_grad():
        program = torch.export.export(model, (tokens,), dynamic_shapes=({1: seq},))
    return model, program, tokens


def judged(model: nn.Module, run, length: int) -> dict:
    from composer.run.accuracy import judge, truth

    tokens = torch.randint(0, 2048, (1, length), generator=torch.Generator().manual_seed(length))
    with torch.no_grad():
        eager = model(tokens)
    true, name = truth(model, (tokens,))
    try:
        outputs = run(tokens)
    except Exception as error:  # noqa: BLE001 - recorded, the case goes on
        return {"length": length, "error": str(error).splitlines()[0][:300]}
    verdict = judge(outputs, eager, true, truth_name=name)
    worst = verdict.outputs[0]
    return {
        "length": length,
        "ok": verdict.ok,
        "rmse": worst.program_error,
        "eager_rmse": worst.eager_error,
        "ratio": (worst.program_error / worst.eager_error) if worst.eager_error else None,
        "verdict": verdict.describe(),
    }


def runner_run(buffer: bytes, data_files):
    from composer.run import cpp_runtime

    runner = cpp_runtime.runner_path()
    return lambda tokens: cpp_runtime.run_program(runner, buffer, data_files, [tokens])


def plain_bf16() -> dict:
    from executorch.backends.cuda.cuda_backend import CudaBackend
    from executorch.backends.cuda.cuda_partitioner import CudaPartitioner
    from executorch.exir import to_edge_transform_and_lower

    model, program, _ = encoder(torch.bfloat16)
    start = time.perf_counter()
    specs = [CudaBackend.generate_method_name_compile_spec("forward")]
    edge = to_edge_transform_and_lower(copy.deepcopy(program), partitioner=[CudaPartitioner(specs)])
    with torch.no_grad():
        et = edge.to_executorch()
    seconds = time.perf_counter() - start
    run = runner_run(et.buffer, {k: bytes(v) for k, v in (et._tensor_data or {}).items()})
    return {"lower_s": round(seconds, 1), "sizes": [judged(model, run, n) for n in LENGTHS]}


def composed(dtype: torch.dtype, stack: str) -> dict:
    import composer

    model, program, _ = encoder(dtype)
    start = time.perf_counter()
    lines: list[str] = []
    try:
        composition = composer.compose(
            copy.deepcopy(program), stack, cache=False,
            progress=lambda line: (lines.append(f"{time.perf_counter() - start:.0f}s {line}"),
                                   print(lines[-1], file=sys.stderr)),
        )  # fmt: skip
    except composer.ComposerError as error:
        return {"stack": stack, "compose_s": round(time.perf_counter() - start, 1),
                "refused": str(error)[:1500], "progress": lines[-12:]}  # fmt: skip
    seconds = time.perf_counter() - start
    plan = composition.plan
    run = runner_run(composition.buffer, composition.data_files)
    return {
        "stack": stack,
        "compose_s": round(seconds, 1),
        "proof": plan.proof,
        "repairs": [(r.partition, r.why[:200], r.moved_to) for r in plan.repairs],
        "nodes": {b: len(plan.nodes_on(b)) for b in (*plan.backends, "portable")},
        "sizes": [judged(model, run, n) for n in LENGTHS],
        "progress": lines[-12:],
    }


CASES = {
    "plain_bf16": plain_bf16,
    "composer_bf16": lambda: composed(torch.bfloat16, "cuda"),
    "composer_fp32_mixed": lambda: composed(torch.float32, "xnnpack,cuda"),
    "composer_fp32": lambda: composed(torch.float32, "cuda"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    os.environ.setdefault("COMPOSER_CACHE_DIR", tempfile.mkdtemp())
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    for case in args.cases.split(","):
        start = time.perf_counter()
        try:
            result = CASES[case]()
        except Exception as error:  # noqa: BLE001 - recorded, the next case goes on
            result = {"error": f"{type(error).__name__}: {str(error)[:600]}",
                      "trace": traceback.format_exc()[-1500:]}  # fmt: skip
        result = {"case": case, "device": device, "s": round(time.perf_counter() - start, 1),
                  **result}  # fmt: skip
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
