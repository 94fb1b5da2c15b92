"""Issue 41 item 6 on the GPU machine: models of optimum-executorch's ``cuda`` recipe, built from
small transformers configs (random weights), exported by optimum's own task code with its
``cuda`` recipe (plain ExecuTorch: ``CudaPartitioner``) and with the ``composer`` recipe
(``composer.models.optimum``) for ``cuda`` and ``xnnpack,cuda``; each program then prefills 5
tokens and decodes 3 in ExecuTorch's C++ runtime (bench/et_runtime's runner), every step's
last-token logits judged as composer's proof judges (``composer.run.accuracy.judge``: against
the model in fp64, beside eager fp32, each run on the whole sequence so far without a cache),
and a decode call timed (``--repeats`` calls, with an A/A: the first program timed again).

Subcommands (``device`` is the one device command; ``export`` what it runs, a process each):

    python3 bench/gpu/gpu_optimum.py device --out $OUT/optimum --models llama,gemma3
    python3 bench/gpu/gpu_optimum.py export --model llama --recipe composer:xnnpack,cuda --out DIR

optimum-executorch 1.1.0 pins transformers 5.0.0rc1: the device carries ``.whl-optimum/``
(``pip download --no-deps --python-version 3.12`` of it, optimum 2.0.0, accelerate,
transformers 5.0.0rc1, huggingface_hub 1.x, tokenizers 0.22.1 and their small dependencies),
installed into /tmp/site after ``bench/gpu_setup.sh``. Results: ``OUT/optimum.jsonl``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

RECIPES = ("cuda", "composer:cuda", "composer:xnnpack,cuda")
PROMPT = [1, 17, 230, 5, 99]
DECODE = [40, 41, 42]


# The schemas of ExecuTorch 1.5.1's llama:: custom ops (libcustom_ops_aot_lib.so, read from it
# under torch 2.13 here). optimum-executorch imports them unconditionally (its convert.py imports
# its custom SDPA), and the library is built for torch 2.13: under the GPU machine's torch 2.11
# it fails to load ("undefined symbol ... torch7Library4_def"). The cuda recipe uses none of
# them (optimum refuses custom SDPA for CUDA), so their schemas alone, defined without kernels,
# let the import pass; a program that called one would fail, not compute something else.
LLAMA_OP_SCHEMAS = (
    "sdpa_with_kv_cache(Tensor query, Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, SymInt start_pos, SymInt seq_len, Tensor? attn_mask=None, float drpout_p=0., bool is_causal=False, float? scale=None) -> Tensor",
    "sdpa_with_kv_cache.out(Tensor query, Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, SymInt start_pos, SymInt seq_len, Tensor? attn_mask=None, float drpout_p=0., bool is_causal=False, float? scale=None, *, Tensor(c!) out) -> Tensor(c!)",
    "fast_hadamard_transform(Tensor mat) -> Tensor",
    "fast_hadamard_transform.out(Tensor mat, *, Tensor(a!) out) -> Tensor(a!)",
    "quantized_moe_ffn(Tensor x, Tensor gate_weight, Tensor expert_bias, Tensor packed_w13, Tensor packed_w2, int num_activated_experts, int num_experts, int hidden_dim, int dim, int group_size, int weight_nbit, str score_func, float route_scale) -> Tensor",
    "quantized_moe_ffn.out(Tensor x, Tensor gate_weight, Tensor expert_bias, Tensor packed_w13, Tensor packed_w2, int num_activated_experts, int num_experts, int hidden_dim, int dim, int group_size, int weight_nbit, str score_func, float route_scale, *, Tensor(a!) out) -> Tensor(a!)",
    "custom_sdpa(Tensor query, Tensor key, Tensor value, SymInt start_pos, Tensor? attn_mask=None, float drpout_p=0., bool is_causal=False, float? scale=None) -> Tensor",
    "custom_sdpa.out(Tensor query, Tensor key, Tensor value, SymInt start_pos, Tensor? attn_mask=None, float drpout_p=0., bool is_causal=False, float? scale=None, *, Tensor(a!) out) -> Tensor(a!)",
    "update_cache(Tensor value, Tensor(a!) cache, SymInt start_pos) -> Tensor",
    "update_cache.out(Tensor value, Tensor(a!) cache, SymInt start_pos, *, Tensor(b!) out) -> Tensor(b!)",
    "update_cache_with_indices(Tensor value, Tensor(a!) cache, SymInt start_pos, Tensor indices) -> Tensor",
    "update_cache_with_indices.out(Tensor value, Tensor(a!) cache, SymInt start_pos, Tensor indices, *, Tensor(b!) out) -> Tensor(b!)",
    "gated_delta_rule(Tensor query, Tensor key, Tensor value, Tensor decay, Tensor beta, Tensor initial_state) -> (Tensor, Tensor)",
    "gated_delta_rule.out(Tensor query, Tensor key, Tensor value, Tensor decay, Tensor beta, Tensor initial_state, *, Tensor(a!) out, Tensor(b!) final_state_out) -> (Tensor(a!), Tensor(b!))",
    "channelwise_gated_delta_rule(Tensor query, Tensor key, Tensor value, Tensor decay, Tensor beta, Tensor initial_state) -> (Tensor, Tensor)",
    "channelwise_gated_delta_rule.out(Tensor query, Tensor key, Tensor value, Tensor decay, Tensor beta, Tensor initial_state, *, Tensor(a!) out, Tensor(b!) final_state_out) -> (Tensor(a!), Tensor(b!))",
    "custom_quantized_sdpa(Tensor query, Tensor key, Tensor value, SymInt start_pos, Tensor? attn_mask=None, float drpout_p=0., bool is_causal=False, float? scale=None, Tensor? q_zero_points=None, Tensor? q_scales=None, Tensor? k_zero_points=None, Tensor? k_scales=None, Tensor? v_zero_points=None, Tensor? v_scales=None, bool is_seq_at_dim_2=False) -> Tensor",
    "custom_quantized_sdpa.out(Tensor query, Tensor key, Tensor value, SymInt start_pos, Tensor? attn_mask=None, float drpout_p=0., bool is_causal=False, float? scale=None, Tensor? q_zero_points=None, Tensor? q_scales=None, Tensor? k_zero_points=None, Tensor? k_scales=None, Tensor? v_zero_points=None, Tensor? v_scales=None, bool is_seq_at_dim_2=False, *, Tensor(a!) out) -> Tensor(a!)",
)


def define_llama_ops_without_their_library() -> None:
    import torch

    try:
        torch.ops.llama.sdpa_with_kv_cache.default  # noqa: B018 - loaded already?
        return
    except (AttributeError, RuntimeError):
        pass
    if torch.__version__.startswith("2.13"):
        return  # the library loads: ExecuTorch's own import does it
    # FRAGMENT: another library may hold the llama namespace already (one did on the device).
    library = torch.library.Library("llama", "FRAGMENT")
    for schema in LLAMA_OP_SCHEMAS:
        name, _, overload = schema.split("(", 1)[0].partition(".")
        if not hasattr(getattr(torch.ops.llama, name, None) or object(), overload or "default"):
            library.define(schema)
    _KEPT.append(library)  # a Library object unregisters its ops when collected


_KEPT: list = []


def emit(out: Path, record: dict) -> None:
    with open(out / "optimum.jsonl", "a") as file:
        file.write(json.dumps({"t": round(time.time(), 1), **record}, default=str) + "\n")
    print(json.dumps(record, default=str)[:1500], flush=True)


def build(name: str, folder: Path) -> None:
    import torch
    import transformers

    small = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "max_position_embeddings": 128}  # fmt: skip
    torch.manual_seed(0)
    if name == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**small))
    elif name == "gemma3":
        config = transformers.Gemma3TextConfig(**small, head_dim=16, sliding_window=32)
        model = transformers.Gemma3ForCausalLM(config)
    else:
        raise SystemExit(f"no model {name}")
    model.save_pretrained(folder)


def cmd_export(args) -> None:
    define_llama_ops_without_their_library()
    # main_export imports every recipe module, and the coreml one needs coremltools, which the
    # GPU machine lacks: the cuda recipe's module alone (composer's registers itself above).
    from optimum.exporters.executorch import convert, main_export

    import composer.models.optimum  # noqa: F401 - registers the composer recipe

    convert.discover_recipes = lambda: importlib.import_module(
        "optimum.exporters.executorch.recipes.cuda"
    )

    out = Path(args.out)
    source = out / f"{args.model}_hf"
    recipe, _, backends = args.recipe.partition(":")
    kwargs = {"backends": backends} if backends else {}
    target = out / f"{args.model}_{args.recipe.replace(':', '_').replace(',', '_')}"
    record = {"kind": "export", "model": args.model, "recipe": args.recipe}
    started = time.perf_counter()
    try:
        main_export(str(source), task="text-generation", recipe=recipe, output_dir=str(target),
                    recipe_kwargs=kwargs, max_seq_len=64)  # fmt: skip
        record.update(ok=True, pte=str(target / "model.pte"),
                      ptd=[str(p) for p in sorted(target.glob("*.ptd"))])  # fmt: skip
    except Exception as error:  # noqa: BLE001 - a failed export is a result
        record.update(ok=False, error=f"{type(error).__name__}: {error}"[:3000],
                      trace=traceback.format_exc()[-3000:])  # fmt: skip
    record["s"] = round(time.perf_counter() - started, 1)
    emit(out, record)


# optimum exports Gemma3 with a static token dimension of one: its prefill is one token a call.
ONE_TOKEN_A_CALL = {"gemma3"}


def steps(model_name: str = "llama"):
    import torch

    if model_name in ONE_TOKEN_A_CALL:
        found = [(torch.tensor([[t]]), torch.tensor([i])) for i, t in enumerate(PROMPT)]
    else:
        found = [(torch.tensor([PROMPT]), torch.arange(len(PROMPT)))]
    found += [(torch.tensor([[t]]), torch.tensor([len(PROMPT) + i])) for i, t in enumerate(DECODE)]
    return found


def references(model_name: str, out: Path):
    """Per step: (eager fp32, fp64) last-token logits, each from the whole sequence so far."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out / f"{model_name}_hf").eval()
    truth = AutoModelForCausalLM.from_pretrained(out / f"{model_name}_hf").eval().double()
    sequence, found = [], []
    with torch.no_grad():
        for tokens, _positions in steps(model_name):
            sequence += tokens[0].tolist()
            ids = torch.tensor([sequence])
            found.append((model(ids).logits[:, -1], truth(ids).logits[:, -1]))
    return found


def cmd_run(args) -> None:
    from composer.run import cpp_runtime
    from composer.run.accuracy import judge

    out = Path(args.out)
    runner = os.environ[cpp_runtime.RUNNER_VARIABLE]
    exports = [json.loads(line) for line in (out / "optimum.jsonl").read_text().splitlines()]
    exports = [e for e in exports if e.get("kind") == "export" and e.get("ok")]
    for model_name in sorted({e["model"] for e in exports}):
        refs = references(model_name, out)
        timed = {}
        for export in [e for e in exports if e["model"] == model_name]:
            record = {"kind": "run", "model": model_name, "recipe": export["recipe"]}
            try:
                report = cpp_runtime.run_pte_detailed(
                    runner, export["pte"], export["ptd"], list(steps(model_name)[-1]),
                    repeats=args.repeats, warmup=10, steps=steps(model_name),
                )  # fmt: skip
                verdicts = []
                for got, (eager, true) in zip(report["step_outputs"], refs, strict=True):
                    last = got[0][:, -1] if got[0].dim() == 3 else got[0]
                    verdicts.append(judge(last.float(), eager, true))
                seconds = sorted(report["seconds"])
                median_us = 1e6 * seconds[len(seconds) // 2]
                timed[export["recipe"]] = median_us
                record.update(ok=all(v.ok for v in verdicts),
                              steps=[v.describe() for v in verdicts],
                              decode_median_us=round(median_us, 1),
                              tokens_per_s=round(1e6 / median_us, 1))  # fmt: skip
            except Exception as error:  # noqa: BLE001 - a program that fails to run is a result
                record.update(ok=False, error=f"{type(error).__name__}: {error}"[:3000])
            emit(out, record)
        first = next((e for e in exports if e["model"] == model_name), None)
        if first is not None and timed:  # A/A: the first program again, as another program
            report = cpp_runtime.run_pte_detailed(
                runner, first["pte"], first["ptd"], list(steps(model_name)[-1]),
                repeats=args.repeats, warmup=10, steps=steps(model_name),
            )  # fmt: skip
            seconds = sorted(report["seconds"])
            emit(out, {"kind": "aa", "model": model_name, "recipe": first["recipe"],
                       "decode_median_us": round(1e6 * seconds[len(seconds) // 2], 1)})  # fmt: skip


def cmd_device(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    me = [sys.executable, str(Path(__file__).resolve())]
    for name in args.models.split(","):
        build(name, out / f"{name}_hf")
    procs = []
    for name in args.models.split(","):
        for recipe in args.recipes.split(";"):
            log = open(out / f"export_{name}_{recipe.replace(':', '_').replace(',', '_')}.log", "w")  # noqa: SIM115
            procs.append(subprocess.Popen(me + ["export", "--model", name, "--recipe", recipe,
                                                "--out", str(out)], stdout=log, stderr=subprocess.STDOUT))  # fmt: skip
    deadline = time.time() + args.limit
    for proc in procs:
        try:
            proc.wait(timeout=max(deadline - time.time(), 1))
        except subprocess.TimeoutExpired:
            proc.kill()
    subprocess.run(me + ["run", "--out", str(out), "--repeats", str(args.repeats)], check=False)


def main() -> None:
    warnings.simplefilter("ignore")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("device")
    p.add_argument("--out", required=True)
    p.add_argument("--models", default="llama,gemma3")
    p.add_argument("--recipes", default=";".join(RECIPES))
    p.add_argument("--limit", type=float, default=380, help="seconds for the exports")
    p.add_argument("--repeats", type=int, default=200)
    p = sub.add_parser("export")
    p.add_argument("--model", required=True)
    p.add_argument("--recipe", required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("run")
    p.add_argument("--out", required=True)
    p.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    {"device": cmd_device, "export": cmd_export, "run": cmd_run}[args.command](args)


if __name__ == "__main__":
    main()
