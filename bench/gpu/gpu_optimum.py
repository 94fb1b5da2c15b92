"""Issue 41 item 6 on the GPU machine: models of optimum-executorch's ``cuda`` recipe, built from
small transformers configs (random weights), exported by optimum's own task code with its
``cuda`` recipe (plain ExecuTorch: ``CudaPartitioner``) and with the ``composer`` recipe
(``composer.models.optimum``) for ``cuda`` and ``xnnpack,cuda``; each program then prefills 5
tokens and decodes 3 in ExecuTorch's C++ runtime (bench/et_runtime's runner), every step's
last-token logits judged as composer's proof judges (``composer.run.accuracy.judge``: against
the model in fp64, beside eager fp32, each run on the whole sequence so far without a cache),
and a decode call timed (``--repeats`` calls, with an A/A: the first program timed again).

A model is ``NAME`` (fp32) or ``NAME@bf16`` (optimum's ``dtype="bfloat16"``, where its own
``cuda`` recipe runs: the pair the tier's speed line needs). ``whisper`` is an encoder-decoder
(optimum's ``automatic-speech-recognition`` task: methods ``encoder`` and ``text_decoder``): its
encoder runs once on 2 s of random log-mel features, then the decoder steps on the program's own
encoder output, each step's logits judged against the whole model in fp64 on the same features.

Subcommands (``device`` is the one device command; ``export`` what it runs, a process each):

    python3 bench/gpu/gpu_optimum.py device --out $OUT/optimum --models llama,gemma3@bf16,whisper
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
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

from processes import run_at_most  # beside this script

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


DTYPES = {"": "float32", "bf16": "bfloat16"}
TASKS = {"whisper": "automatic-speech-recognition"}  # the others: text-generation


def spec(model: str) -> tuple[str, str]:
    """(name, optimum's dtype) of ``NAME`` or ``NAME@bf16``."""
    name, _, dtype = model.partition("@")
    return name, DTYPES[dtype]


def slug(text: str) -> str:
    """``text`` (a model or recipe) as a file name."""
    return text.replace("@", "_").replace(":", "_").replace(",", "_")


def build(name: str, folder: Path) -> None:
    import torch
    import transformers

    if name == "whisper":
        return build_whisper(folder)

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


def build_whisper(folder: Path) -> None:
    """A small Whisper (2+2 layers, d 64, 80 mel bins, 2 s of audio: 200 frames) with the
    processor optimum reads the encoder's input shape from (a byte-level tokenizer, no merges)."""
    import torch
    import transformers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    torch.manual_seed(0)
    config = transformers.WhisperConfig(
        vocab_size=512, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=80,
        max_source_positions=100, max_target_positions=64, decoder_start_token_id=1,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    transformers.WhisperForConditionalGeneration(config).save_pretrained(folder)
    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    tokenizer = transformers.WhisperTokenizer(vocab=vocab, merges=[])
    features = transformers.WhisperFeatureExtractor(feature_size=80, chunk_length=2)
    transformers.WhisperProcessor(features, tokenizer).save_pretrained(folder)


def cmd_export(args) -> None:
    define_llama_ops_without_their_library()
    # main_export imports every recipe module, and the coreml one needs coremltools, which the
    # GPU machine lacks: the plain recipe's module alone (composer's registers itself).
    from optimum.exporters.executorch import convert, main_export

    import composer.models.optimum  # noqa: F401 - registers the composer recipe

    recipe, _, backends = args.recipe.partition(":")
    convert.discover_recipes = lambda: importlib.import_module(
        f"optimum.exporters.executorch.recipes.{'cuda' if recipe == 'composer' else recipe}"
    )

    out = Path(args.out)
    name, dtype = spec(args.model)
    source = out / f"{name}_hf"
    kwargs = {"backends": backends} if backends else {}
    target = out / f"{slug(args.model)}_{slug(args.recipe)}"
    record = {"kind": "export", "model": args.model, "recipe": args.recipe}
    started = time.perf_counter()
    try:
        written = main_export(str(source), task=TASKS.get(name, "text-generation"), recipe=recipe,
                              output_dir=str(target), recipe_kwargs=kwargs, max_seq_len=64,
                              dtype=dtype)  # fmt: skip
        record.update(ok=True, pte=str(target / "model.pte"),
                      ptd=[str(p) for p in sorted(target.glob("*.ptd"))])  # fmt: skip
        composition = getattr(written["model"], "composition", None)  # composer's recipe
        if composition is not None:
            record["methods"] = {
                method: {"proof": plan.proof, "delegates": plan.delegate_calls,
                         "repairs": [f"{r.partition}: {r.why[:300]} -> "
                                     f"{r.options or r.moved_to}" for r in plan.repairs]}
                for method, plan in composition.plans.items()
            }  # fmt: skip
    except Exception as error:  # noqa: BLE001 - a failed export is a result
        record.update(ok=False, error=f"{type(error).__name__}: {error}"[:3000],
                      trace=traceback.format_exc()[-3000:])  # fmt: skip
    record["s"] = round(time.perf_counter() - started, 1)
    emit(out, record)


# optimum exports Gemma3 with a static token dimension of one: its prefill is one token a call.
ONE_TOKEN_A_CALL = {"gemma3"}
WHISPER_START = 1  # the config's decoder_start_token_id


def steps(model: str = "llama"):
    """The decoder's inputs, call by call (Whisper's without the encoder's output)."""
    import torch

    name, _ = spec(model)
    if name == "whisper":
        tokens = [WHISPER_START, *DECODE]
        return [(torch.tensor([[t]]), torch.tensor([i])) for i, t in enumerate(tokens)]
    if name in ONE_TOKEN_A_CALL:
        found = [(torch.tensor([[t]]), torch.tensor([i])) for i, t in enumerate(PROMPT)]
    else:
        found = [(torch.tensor([PROMPT]), torch.arange(len(PROMPT)))]
    found += [(torch.tensor([[t]]), torch.tensor([len(PROMPT) + i])) for i, t in enumerate(DECODE)]
    return found


def whisper_features(dtype):
    import torch

    generator = torch.Generator().manual_seed(0)
    return torch.randn(1, 80, 200, generator=generator).to(dtype)


def references(model: str, out: Path):
    """Per step: (eager in the model's dtype, fp64) last-token logits, each from the whole
    sequence so far (Whisper's: its encoder on the features, then its decoder on the tokens so
    far); for Whisper also the encoder's output first."""
    import torch
    from transformers import AutoModelForCausalLM, WhisperForConditionalGeneration

    name, dtype = spec(model)
    dtype = getattr(torch, dtype)
    loader = WhisperForConditionalGeneration if name == "whisper" else AutoModelForCausalLM
    eager = loader.from_pretrained(out / f"{name}_hf").eval().to(dtype)
    truth = loader.from_pretrained(out / f"{name}_hf").eval().double()
    sequence, found = [], []
    with torch.no_grad():
        if name == "whisper":
            features = whisper_features(dtype)
            found.append((eager.model.encoder(features).last_hidden_state,
                          truth.model.encoder(features.double()).last_hidden_state))  # fmt: skip
        for tokens, _positions in steps(model):
            sequence += tokens[0].tolist()
            ids = torch.tensor([sequence])
            if name == "whisper":
                pair = (eager(input_features=features, decoder_input_ids=ids).logits,
                        truth(input_features=features.double(), decoder_input_ids=ids).logits)  # fmt: skip
            else:
                pair = (eager(ids).logits, truth(ids).logits)
            found.append(tuple(logits[:, -1] for logits in pair))
    return found


def run_program(runner: str, export: dict, model: str, repeats: int):
    """(every output judged, in step order; the decode call's median seconds) of an export's
    program in the runner: Whisper's encoder once, then its decoder on that encoder's output."""
    import torch

    from composer.run import cpp_runtime

    name, dtype = spec(model)
    decoder_steps = list(steps(model))
    method, outputs = "forward", []
    if name == "whisper":
        method = "text_decoder"
        features = whisper_features(getattr(torch, dtype))
        encoded = cpp_runtime.run_pte_detailed(runner, export["pte"], export["ptd"], [features],
                                               repeats=1, warmup=0, method="encoder")["outputs"][0]  # fmt: skip
        outputs.append(encoded)
        decoder_steps = [(tokens, encoded, position) for tokens, position in decoder_steps]
    report = cpp_runtime.run_pte_detailed(
        runner, export["pte"], export["ptd"], list(decoder_steps[-1]), repeats=repeats,
        warmup=10, steps=decoder_steps, method=method,
    )  # fmt: skip
    for got in report["step_outputs"]:
        outputs.append(got[0][:, -1] if got[0].dim() == 3 else got[0])
    seconds = sorted(report["seconds"])
    return outputs, seconds[len(seconds) // 2]


def cmd_run(args) -> None:
    """Every export's program run and judged once, then its decode call timed in ``--rounds``
    rounds that take turns (the median of each round's calls; the median of those), with the
    model's first program timed a second time as if it were another (the A/A)."""
    from composer.run import cpp_runtime
    from composer.run.accuracy import judge

    out = Path(args.out)
    runner = os.environ[cpp_runtime.RUNNER_VARIABLE]
    exports = [json.loads(line) for line in (out / "optimum.jsonl").read_text().splitlines()]
    exports = [e for e in exports if e.get("kind") == "export" and e.get("ok")]
    for model in sorted({e["model"] for e in exports}):
        refs = references(model, out)
        ran = []
        for export in [e for e in exports if e["model"] == model]:
            record = {"kind": "run", "model": model, "recipe": export["recipe"]}
            try:
                outputs, _ = run_program(runner, export, model, 1)
                verdicts = [judge(got, eager, true)
                            for got, (eager, true) in zip(outputs, refs, strict=True)]  # fmt: skip
                record.update(ok=all(v.ok for v in verdicts),
                              steps=[v.describe() for v in verdicts])  # fmt: skip
                ran.append(export)
            except Exception as error:  # noqa: BLE001 - a program that fails to run is a result
                record.update(ok=False, error=f"{type(error).__name__}: {error}"[:3000])
            emit(out, record)
        timed = [(e["recipe"], e) for e in ran] + [(f"{ran[0]['recipe']} (A/A)", ran[0])] * bool(
            ran
        )
        rounds: dict[str, list[float]] = {label: [] for label, _ in timed}
        for _ in range(args.rounds):
            for label, export in timed:
                rounds[label].append(run_program(runner, export, model, args.repeats)[1])
        for label, medians in rounds.items():
            median_s = statistics.median(medians)
            emit(out, {"kind": "time", "model": model, "recipe": label,
                       "decode_median_us": round(1e6 * median_s, 1),
                       "tokens_per_s": round(1 / median_s, 1),
                       "round_medians_us": [round(1e6 * m, 1) for m in medians]})  # fmt: skip


def cmd_device(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    me = [sys.executable, str(Path(__file__).resolve())]
    for name in sorted({spec(model)[0] for model in args.models.split(",")}):
        build(name, out / f"{name}_hf")
    # --parallel 1 for compose times that compare (plain against composer, one at a time).
    run_at_most(
        [(me + ["export", "--model", name, "--recipe", recipe, "--out", str(out)],
          out / f"export_{slug(name)}_{slug(recipe)}.log")
         for name in args.models.split(",") for recipe in args.recipes.split(";")],
        args.parallel, total=args.limit,
    )  # fmt: skip
    subprocess.run(me + ["run", "--out", str(out), "--repeats", str(args.repeats),
                         "--rounds", str(args.rounds)], check=False)  # fmt: skip


def main() -> None:
    warnings.simplefilter("ignore")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("device")
    p.add_argument("--out", required=True)
    p.add_argument("--models", default="llama,gemma3")
    p.add_argument("--recipes", default=";".join(RECIPES))
    p.add_argument("--limit", type=float, default=380, help="seconds for the exports")
    p.add_argument("--parallel", type=int, default=16, help="exports at once")
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p = sub.add_parser("export")
    p.add_argument("--model", required=True)
    p.add_argument("--recipe", required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("run")
    p.add_argument("--out", required=True)
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    {"device": cmd_device, "export": cmd_export, "run": cmd_run}[args.command](args)


if __name__ == "__main__":
    main()
