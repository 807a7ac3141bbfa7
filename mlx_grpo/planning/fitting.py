"""The memory plan (plan.py) applied: a model's shape read from its files, this machine's budget, and
`fit_run`, which a run calls before its model loads (`micro_batch_size: auto` resolved, a run that cannot
fit refused). plan.py is the model of memory; this module is where it meets files and the machine.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from ..common.errors import UserError
from ..common.units import GB, GIB, gb_text
from ..config.train_config import TrainConfig
from ..data import load_datasets, longest_prompt
from ..models.policy import dequantizes, is_gguf, load_tokenizer, model_config, resolve_dtype, resolve_model_path
from .budget import Verdict, plan
from .machine import device_info, memory_share
from .plan import ModelShape, Shapes, dtype_bytes, evaluation_rows, predict
from .presets import preset_config

# ----------------------------------------------------------------------------- budgets

def mac_working_set(memory_gb: float) -> float:
    """Metal's recommended working set, in bytes, of an Apple-silicon Mac sold as `memory_gb` of unified
    memory (Apple's "16 GB" is 16 GiB): about two thirds of it up to 32, three quarters above (what
    `mx.device_info()` reports)."""
    return memory_gb * GIB * (2 / 3 if memory_gb <= 32 else 3 / 4)


def parse_memory(text: str) -> float:
    """'16GB', '16', '24 GiB' -> gigabytes."""
    cleaned = text.strip().lower().replace(" ", "")
    for suffix in ("gib", "gb", "g"):
        if cleaned.endswith(suffix):
            cleaned = cleaned[: -len(suffix)]
            break
    try:
        value = float(cleaned)
    except ValueError:
        raise UserError(f"--memory {text!r}: expected a size such as 16GB") from None
    if not math.isfinite(value) or value <= 0:
        raise UserError(f"--memory {text!r}: expected a positive size such as 16GB")
    return value


def _on_gpu() -> bool:
    import mlx.core as mx

    return mx.default_device().type == mx.gpu


def this_machine_budget() -> tuple[float, str]:
    import mlx.core as mx
    import psutil

    share = memory_share()
    of = f"1/{share} of " if share > 1 else ""  # a parallel sweep's trial
    if mx.metal.is_available():
        working_set = device_info().get("max_recommended_working_set_size")
        if working_set:
            return float(working_set) / share, f"{of}this Mac's recommended working set"
    return float(psutil.virtual_memory().total) * 0.9 / share, f"{of}90% of this machine's memory"


# ----------------------------------------------------------------------------- the model's shape

def read_model_shape(model_id: str, base_dir: Path) -> ModelShape:
    """The shape of `model_id` from its config.json (a GGUF file's metadata, or a `preset:NAME`), without
    loading any weights (a GGUF file's are read, not built into a model)."""

    if model_id.startswith("preset:"):
        return ModelShape.from_config(preset_config(model_id.removeprefix("preset:")), model_id)
    resolved = resolve_model_path(model_id, base_dir, need_weights=False)
    if is_gguf(resolved):
        return ModelShape.from_config(model_config(resolved), resolved)
    path = Path(resolved)
    config_file = path / "config.json"
    if not config_file.is_file():
        config_file = _hub_config(model_id)
    try:
        config = json.loads(config_file.read_text())
        if isinstance(config, dict):
            _check_config_types(config, config_file)
        return ModelShape.from_config(config, str(config_file))
    except (OSError, ValueError) as err:
        raise UserError(f"{config_file}: cannot read the model's shape: {err}") from None
    except (TypeError, KeyError, AttributeError, RecursionError) as err:  # a value of a shape no model has
        detail = (str(err).splitlines() or [""])[0][:120]
        raise UserError(f"{config_file}: cannot read the model's shape ({type(err).__name__}: {detail})") from None


def _check_config_types(config: dict, config_file: Path) -> None:
    """The keys whose type the model libraries assume without checking: one line naming the key."""
    for key, kind, expected in (("model_type", str, "a string"), ("layer_types", list, "a list"),
                                ("num_hidden_layers", int, "a whole number")):
        value = config.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise UserError(f"{config_file}: '{key}' is {str(value)[:40]}; expected {expected}")


def _hub_config(model_id: str) -> Path:
    """A hub model's config.json: from the local cache, else downloaded alone (a few kB)."""
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache
        from huggingface_hub.utils import logging as hub_logging

        cached = try_to_load_from_cache(model_id, "config.json")
        if isinstance(cached, str):
            return Path(cached)
        hub_logging.set_verbosity_error()  # its retry warnings would bury our one line
        return Path(hf_hub_download(model_id, "config.json"))
    except Exception as err:  # offline, unknown repo, no access: one line either way
        raise UserError(f"model '{model_id}': cannot read its config.json ({type(err).__name__}); "
                        f"download the model or give a local directory") from None


# ----------------------------------------------------------------------------- one call for the CLI and train

def make_plan(config: TrainConfig, base_dir: Path, memory: str | None = None) -> tuple[Verdict, dict]:
    """The plan of `config` on this machine, or on a Mac with `memory` ('16GB') of unified memory."""

    shape = read_model_shape(config.model_id, base_dir)
    dtype = resolve_dtype(config, gpu=True if memory is not None else None)  # a Mac computes on its GPU
    dequantized = shape.bits is not None and dequantizes(config, shape.parameters() * dtype_bytes(dtype),
                                                          gpu=True if memory is not None else None)
    if dequantized:
        shape = replace(shape, bits=None)
    if memory is not None:
        size = parse_memory(memory)
        budget, source = mac_working_set(size), f"the recommended working set of a {size:g} GB Mac"
    else:
        budget, source = this_machine_budget()
    # which machine the dtype, precision and peaks are for: a Mac plans bfloat16 on its GPU, this CPU float32
    machine = (f"a {parse_memory(memory):g} GB Mac's GPU" if memory is not None else
               f"this machine's {'GPU' if _on_gpu() else 'CPU'}")
    longest, unread = longest_prompt_tokens(config, base_dir)
    prompt_length = config.max_prompt_length if longest is None else min(longest, config.max_prompt_length)
    shapes = Shapes(config.batch_size, config.num_generations, prompt_length, config.max_generation_steps)
    lora_dtype = resolve_dtype(replace(config, use_lora=True), gpu=True if memory is not None else None)
    verdict = plan(shape, shapes, config, dtype, budget, source, lora_dtype)
    if config.eval_every > 0 and isinstance(config.eval_batch_size, int):  # counts in every setting tried
        shapes = replace(shapes, eval_rows=config.eval_batch_size)
        verdict = plan(shape, shapes, config, dtype, budget, source, lora_dtype)
    elif config.eval_every > 0:  # chosen under the step's own peak, so the run's peak and verdict stand
        shapes = replace(shapes, eval_rows=evaluation_rows(shape, shapes, config, verdict.settings, dtype,
                                                           config.eval_size))
        verdict = replace(verdict, configured=predict(shape, shapes, config, verdict.settings, dtype))
    facts = {"model": config.model_id, "parameters": shape.parameters(), "layers": shape.layers,
             "vocab": shape.vocab, "dtype": dtype, "bits": shape.bits, "dequantized": dequantized, "machine": machine,
             "prompts": shapes.prompts,
             "group_size": shapes.group_size, "prompt_length": shapes.prompt_length,
             "prompt_length_from": "max_prompt_length" if longest is None else "the dataset's longest prompt",
             "completion_length": shapes.completion_length, "reference_pass": config.beta > 0,
             "eval_rows": shapes.eval_rows or shapes.sequences,
             **({"dataset_unread": unread} if unread else {})}
    return verdict, facts


def reference_text(peak: float, facts: dict, unit: str = " GB") -> str:
    """The reference phase's peak, or why there is none: beta 0 computes no reference log-probs, and a
    figure there would describe a pass the run never makes."""
    return f"{peak / GB:.1f}{unit}" if facts["reference_pass"] else "none (beta 0)"


def longest_prompt_tokens(config: TrainConfig, base_dir: Path) -> tuple[int | None, str | None]:
    """The training set's longest prompt in tokens, as the run will encode it: the plan's prompt length, so
    its bound is tight. None when the tokenizer or the dataset cannot be read here (max_prompt_length then),
    with the loader's reason when it was the dataset (the plan says so: the run will refuse it)."""

    try:
        tokenizer = load_tokenizer(config.model_id, base_dir)
        if tokenizer is None:
            return None, None
        tools = None
        if config.tools:  # the chat template shows their schemas in every prompt
            from ..multiturn.tools import resolve_tool, tool_schema
            tools = [tool_schema(name, fn) for name, _, fn in (resolve_tool(spec, base_dir) for spec in config.tools)]
        return longest_prompt(tokenizer, load_datasets(config, base_dir)[0], config, tools=tools), None
    except UserError as err:  # the plan stays an upper bound; the reason is shown, the run refuses it itself
        return None, str(err)


def fit_run(config: TrainConfig, base_dir: Path) -> tuple[TrainConfig, str, float | None]:
    """At the start of a run, before the model loads: `micro_batch_size: auto` resolved, the plan's
    verdict in one line, and its peak in bytes (None without a plan). A run predicted not to fit this
    machine is refused (UserError naming the settings that would fit) unless `memory_check` is off."""
    try:
        verdict, facts = make_plan(config, base_dir)
    except UserError as err:  # no config.json to read (a hub model not downloaded yet, offline)
        fallback = 0 if config.micro_batch_size == "auto" else config.micro_batch_size
        return replace(config, micro_batch_size=fallback), f"memory plan: skipped ({err})", None
    peaks, settings = verdict.configured, verdict.settings
    config = replace(config, micro_batch_size=settings.micro_batch_size, grad_checkpoint=settings.grad_checkpoint,
                     eval_batch_size=facts["eval_rows"] if config.eval_batch_size == "auto" else config.eval_batch_size)
    # an upper bound: every prompt and completion is taken at its longest (prompts: the dataset's longest)
    peak_text = "~" + gb_text(peaks.peak) if peaks.peak >= 0.05 * GB else gb_text(peaks.peak)
    line = (f"memory plan: peak at most {peak_text} of {verdict.budget / GB:.1f} GB "
            "(" + (f"load {peaks.load / GB:.1f}, " if peaks.load == peaks.peak else "")  # only when it is the peak
            + f"rollout {peaks.rollout / GB:.1f}, reference {reference_text(peaks.reference, facts, unit='')}, "
            f"update {peaks.update / GB:.1f}"
            + (f", eval {peaks.evaluation / GB:.1f}" if peaks.evaluation else "") + "; "
            f"prompts <= {facts['prompt_length']}, completions <= {facts['completion_length']} tokens) "
            f"with {verdict.describe(settings)}")
    if verdict.fits or not config.memory_check:
        return config, line, peaks.peak
    if verdict.fitting is not None:
        advice = f"it fits with {verdict.describe(verdict.fitting)}"
    elif verdict.other_changes:
        advice = "it would fit with " + "; or ".join(verdict.other_changes)
    else:
        advice = "no setting makes it fit here"
    raise UserError(f"this run needs ~{peaks.peak / GB:.1f} GB at its peak, more than {verdict.budget / GB:.1f} GB "
                    f"({verdict.budget_source}); {advice}. See `mlx-grpo plan`; memory_check: false starts it anyway")
