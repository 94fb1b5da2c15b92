"""The deploy tier (issue 32): what people ship, composed by composer and by plain ExecuTorch
with the same stack, side by side.

    .venv/bin/python bench/deploy/deploy_bench.py                       # every case, three stacks
    .venv/bin/python bench/deploy/deploy_bench.py --cases signal,llama --stacks xnnpack

Cases: a Conv1d net over a signal of dynamic length; a 2-layer ``nn.TransformerEncoder`` with a
dynamic sequence; export_llama's tiny KV-cache decoder (``composer.models.llama``, dynamic token
dimension); an LSTM called with its ``(h, c)`` state; PT2E-quantized corpus CNNs
(XNNPACKQuantizer, ``composer.models.corpus.quantized``: ResNet-18, MobileNetV2, EfficientNet-B0,
ShuffleNetV2, SqueezeNet). For each stack:

- plain: ``to_edge_transform_and_lower(copy of ep, partitioner=[XnnpackPartitioner(),
  OpenvinoPartitioner(...)] in the stack's order).to_executorch()``; composer:
  ``composer.compose(ep, stack, cache=False)`` (the proof included). Compose seconds of each.
- whether each program runs and matches eager at the example and at each dynamic dim's
  min, middle and max (composer's proof sizes, the same inputs for both);
- latency at each size, composer and plain interleaved (``composer.measure.latency``), with
  plain's program loaded a second time and timed as an A/A control; the planned activation memory of each
  (the program's non-constant buffers, as ExecuTorch's memory planning sized them).
One JSON line per case and stack to ``--out``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
import warnings

import torch

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# corpus_bench (bench/latency) and beyond_corpus (bench/compose), imported below
sys.path[:0] = [os.path.join(BENCH, "latency"), os.path.join(BENCH, "compose")]
from corpus_bench import _plain_partitioners

import composer
from composer.lower.export import eager_of, example_inputs_of
from composer.measure.latency import interleaved
from composer.run.compare import compare
from composer.run.inputs import flat_inputs, sizes_to_prove
from composer.run.program_table import execution_plan
from composer.run.runtime import LoadedProgram
from composer.scheduler.dynamic_dims import dynamic_dims
from composer.scheduler.quantized import output_tolerance


def _signal():
    from torch.export import Dim

    model = torch.nn.Sequential(
        torch.nn.Conv1d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv1d(32, 8, 3, padding=1)
    ).eval()
    x = (torch.randn(1, 16, 50),)
    return torch.export.export(model, x, dynamic_shapes=({2: Dim("length", min=2, max=128)},))


def _encoder():
    from torch.export import Dim

    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2).eval()
    x = (torch.randn(1, 16, 64),)
    return torch.export.export(model, x, dynamic_shapes=({1: Dim("seq", min=2, max=128)},))


def _llama():
    from composer.models import llama

    return llama.exported()[0]


class _Recurrent(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(32, 64, batch_first=True)
        self.head = torch.nn.Linear(64, 16)

    def forward(self, x, state):
        out, (h, c) = self.lstm(x, state)
        return self.head(out), (h, c)


def _lstm():
    x = (torch.randn(1, 20, 32), (torch.randn(1, 1, 64), torch.randn(1, 1, 64)))
    return torch.export.export(_Recurrent().eval(), x)


def _quantized(name: str, dynamic: bool = False):
    def build():
        from composer.models import corpus

        return corpus.quantized(name, dynamic=dynamic)

    return build


# The quantized tier: corpus CNNs as ExecuTorch's XNNPACK guide quantizes them (PT2E int8),
# and the corpus's transformer encoders with their linears dynamically quantized.
QUANTIZED = ("resnet18", "mobilenet_v2", "efficientnet_b0", "shufflenet_v2", "squeezenet")
DYNAMIC_QUANTIZED = ("bert", "whisper_encoder", "deit_tiny", "t5_encoder")


def _example(name: str):
    """ExecuTorch's own example model ``name`` (``executorch.examples.models``), exported as
    its factory gives it: example inputs, keyword inputs and dynamic shapes."""

    def build():
        from composer.models.corpus import _library

        _library("torchvision")  # its CPU-less extension's ops defined, as the corpus does
        from executorch.examples.models import MODEL_NAME_TO_MODEL
        from executorch.examples.models.model_factory import EagerModelFactory

        model, args, kwargs, dynamic = EagerModelFactory.create_model(*MODEL_NAME_TO_MODEL[name])
        return torch.export.export(model.eval(), args, kwargs or None, dynamic_shapes=dynamic)

    return build


# ExecuTorch's example models that build here with no download (the others load pretrained
# weights, torchaudio or torchsr); llama, llama2 and qwen3 are 200M-parameter defaults.
EXAMPLES = ("mul", "linear", "add", "add_mul", "softmax", "conv1d", "lstm", "mv2_untrained",
            "deep_autoencoder", "ds_cnn", "mobilenet_v1_025", "resnet8", "sdpa", "llama2")  # fmt: skip


def _dynamic_hf(name: str):
    """A transformers model of bench/compose/beyond_corpus.py, exported with a dynamic token count."""

    def build():
        from beyond_corpus import EXTRA
        from torch.export import Dim

        model, inputs = EXTRA[name]()
        seq = Dim("seq", min=3, max=32)  # MobileBERT guards seq != 2
        return torch.export.export(model.eval(), inputs, dynamic_shapes=({1: seq},))

    return build


# Encoders and decoders (no KV cache) of bench/compose/beyond_corpus.py with a dynamic token count.
DYNAMIC_HF = ("distilbert", "roberta", "albert", "mobilebert", "qwen2", "phi3", "gemma",
              "opt", "gpt_neox", "bloom")  # fmt: skip

CASES = {
    "signal": _signal,
    "encoder": _encoder,
    "llama": _llama,
    "lstm": _lstm,
    **{f"quantized_{name}": _quantized(name) for name in QUANTIZED},
    **{f"dynamic_quantized_{name}": _quantized(name, True) for name in DYNAMIC_QUANTIZED},
    **{f"example_{name}": _example(name) for name in EXAMPLES},
    **{f"dynamic_{name}": _dynamic_hf(name) for name in DYNAMIC_HF},
}


def _plain(program, backends: list[str]) -> tuple[bytes, float]:
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    started = time.perf_counter()
    with torch.no_grad():
        edge = to_edge_transform_and_lower(
            copy.deepcopy(program),
            partitioner=_plain_partitioners(backends),
            compile_config=EdgeCompileConfig(_check_ir_validity=False),
        )
        buffer = edge.to_executorch().buffer
    return buffer, time.perf_counter() - started


def _planned_bytes(buffer: bytes) -> int:
    return sum(execution_plan(buffer).non_const_buffer_sizes[1:])


def _check(buffer: bytes, eager, inputs, tolerance=None) -> tuple[bool, float, str]:
    try:
        loaded = LoadedProgram(buffer)
        got = loaded.run(flat_inputs(inputs))
    except Exception as error:  # noqa: BLE001 - a bench records every failure
        return False, float("nan"), f"{type(error).__name__}: {str(error)[:300]}"
    with torch.no_grad():
        want = (
            copy.deepcopy(eager)(*inputs) if isinstance(eager, torch.nn.Module) else eager(*inputs)
        )
    ok, worst = compare(got, want, tolerance)
    return ok, worst, ""


def run_case(name: str, stack: str, runs: int) -> dict:
    torch.manual_seed(0)
    program = CASES[name]()
    backends = stack.split(",")
    row: dict = {"case": name, "stack": stack}
    try:
        plain, row["plain_compose_s"] = _plain(program, backends)
        # The A/A control: plain's bytes loaded a second time. Lowering a copy of the program
        # again in this process fails for export_llama's decoder (PendingUnbackedSymbolNotFound,
        # the ShapeEnv that copies share), in plain ExecuTorch as it did in composer.
        plain_again = plain
    except Exception as error:  # noqa: BLE001
        plain = plain_again = None
        row["plain_error"] = f"{type(error).__name__}: {str(error)[:300]}"
    started = time.perf_counter()
    try:
        composition = composer.compose(copy.deepcopy(program), stack, cache=False)
        row["composer_compose_s"] = time.perf_counter() - started
        ours = composition.buffer
        row["composer_proof"] = composition.plan.proof
        row["repairs"] = len(composition.plan.repairs)
    except Exception as error:  # noqa: BLE001
        ours = None
        row["composer_error"] = f"{type(error).__name__}: {str(error)[:300]}"
    dims = dynamic_dims(program)
    sizes = sizes_to_prove(example_inputs_of(program, None), dims)
    eager = eager_of(program, None)
    row["sizes"] = {}
    for label, inputs in sizes:
        entry: dict = {}
        for who, buffer in (("composer", ours), ("plain", plain)):
            if buffer is None:
                continue
            # A quantized program against its q/dq reference: the allowance composer's proof
            # states (plain ExecuTorch has none of its own), for both programs alike.
            ok, worst, error = _check(buffer, eager, inputs, output_tolerance(program))
            entry[who] = {"ok": ok, "max_abs_error": worst, "error": error}
        # Timed where both ran: a quantized program both write off its reference (ShuffleNetV2
        # int8) is still the program each user gets.
        if ours is not None and plain is not None and not any(e["error"] for e in entry.values()):
            flat = flat_inputs(inputs)
            programs = {
                "composer": LoadedProgram(ours),
                "plain": LoadedProgram(plain),
                "plain_again": LoadedProgram(plain_again),
            }
            timed = interleaved({k: p.timed_call(flat) for k, p in programs.items()}, runs)
            entry["latency_us"] = {k: v.median_us for k, v in timed.items()}
            entry["composer_over_plain"] = timed["composer"].median_us / timed["plain"].median_us
            entry["aa_control"] = timed["plain_again"].median_us / timed["plain"].median_us
        row["sizes"][label] = entry
    if ours is not None and plain is not None:
        row["planned_bytes"] = {"composer": _planned_bytes(ours), "plain": _planned_bytes(plain)}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--stacks", default="xnnpack;openvino,xnnpack;xnnpack,openvino")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--out", default="bench/results/deploy_cpu.jsonl")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    with open(args.out, "a") as out:
        for case in args.cases.split(","):
            for stack in args.stacks.split(";"):
                row = run_case(case, stack, args.runs)
                out.write(json.dumps(row) + "\n")
                out.flush()
                sizes = row.get("sizes", {})
                ratios = [f"{e['composer_over_plain']:.2f} (A/A {e['aa_control']:.2f})"
                          for e in sizes.values() if "composer_over_plain" in e]  # fmt: skip
                runs_ok = {
                    who: sum(e.get(who, {}).get("ok", False) for e in sizes.values())
                    for who in ("composer", "plain")
                }
                worst = {
                    who: max((e[who]["max_abs_error"] for e in sizes.values() if who in e),
                             default=float("nan"))
                    for who in ("composer", "plain")
                }  # fmt: skip
                print(
                    f"{case:20} {stack:18} composer {runs_ok['composer']}/{len(sizes)} "
                    f"plain {runs_ok['plain']}/{len(sizes)} sizes run+match (max error "
                    f"{worst['composer']:.3g} / {worst['plain']:.3g}); compose "
                    f"{row.get('composer_compose_s', float('nan')):.1f} s vs plain "
                    f"{row.get('plain_compose_s', float('nan')):.1f} s; latency c/p "
                    f"{', '.join(ratios) or '-'}; planned bytes {row.get('planned_bytes')}"
                    + (
                        f"; composer error {row['composer_error']}"
                        if "composer_error" in row
                        else ""
                    )
                    + (f"; plain error {row['plain_error']}" if "plain_error" in row else ""),
                    flush=True,
                )


if __name__ == "__main__":
    main()
