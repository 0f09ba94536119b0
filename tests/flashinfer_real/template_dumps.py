"""Record a FlashInfer dump for every trace template of the real FlashInfer.

Runs at level 10 under the real FlashInfer, with its own decorator or the native core's
(``FLASHINFER_NATIVE_LOGGING``). No GPU here, so no FlashInfer kernel runs: for each
template with an ``init``, the call is made on a stand-in that carries the API's
identity (``functools.wraps`` of FlashInfer's undecorated function, decorated by
``flashinfer.api_logging.flashinfer_api``, so the recorder writes what a GPU run
writes) and returns the outputs of the template's reference on the init's inputs
(mapped by ``flashinfer_native.reference``, the mapping replay uses). A wrapper's
``plan`` is recorded before its ``run`` on an object of a class of the wrapper's name.

Writes ``manifest.json`` in the working directory: per template, its label, its API,
the dump directories of its calls (the checked one last) or the reason none was
recorded. Prints ``{}`` last.
"""

import functools
import importlib
import inspect
import json
import os
import re
import sys

import torch

import flashinfer
from flashinfer.api_logging import _TRACE_REGISTRY, flashinfer_api
from flashinfer.trace.template import TraceTemplate, Var
from flashinfer_native import reference

# Small shapes for the inits (the values FlashInfer's own init smoke test uses, and the
# length of an indptr): the inits' defaults are real model sizes, too large for a CPU
# test.
VAR_VALUES = {
    "batch_size": 4,
    "num_tokens": 4,
    "seq_len": 8,
    "qo_len": 4,
    "kv_len": 8,
    "vocab_size": 128,
    "num_pages": 8,
    "num_pages_per_seq": 2,
    "len_indptr": 5,
    "num_kv_indices": 8,
    "scalar": 1,
    "hidden_div_2": 2,
    "hidden_div_block_size": 1,
    "batch_size_plus_1": 5,
}
CONST_VALUES = {
    "hidden_size": 128,
    "intermediate_size": 128,
    "num_local_experts": 1,
    "num_experts": 4,
    "num_q_heads": 4,
    "num_qo_heads": 4,
    "num_k_heads": 1,
    "num_kv_heads": 1,
    "num_heads": 4,
    "num_heads_qo": 1,
    "head_dim": 16,
    "head_size": 16,
    "head_dim_ckv": 16,
    "head_dim_kpe": 8,
    "rope_dim": 16,
    "no_rope_dim": 16,
    "rotary_dim": 16,
    "M": 8,
    "N": 8,
    "K": 128,
    "M_max": 8,
    "K_doubled": 16,
    "max_m": 8,
    "max_seq_len": 32,
    "page_size": 4,
    "max_pages_per_seq": 2,
    "stats_dim": 2,
    "ws_elems_per_rank": 4,
    "dim": 16,
    "dstate": 16,
    "topk": 2,
    "n_group": 2,
    "topk_group": 1,
    "max_len": 16,
    "k": 4,
    "pool_size": 4,
}
DUMP_ROOT = os.environ["FLASHINFER_DUMP_DIR"]
SKIP_DIRS = ("data", "moe_ep", "experimental")


def registration_modules():
    """Modules of the installed FlashInfer whose source decorates with ``trace=``."""
    root = os.path.dirname(flashinfer.__file__)
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith("__")]
        for name in files:
            if not name.endswith(".py"):
                continue
            with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
                text = f.read()
            if "@flashinfer_api" in text and re.search(r"trace\s*=", text):
                rel = os.path.relpath(os.path.join(folder, name), os.path.dirname(root))
                found.append(rel[:-3].replace(os.sep, ".").removesuffix(".__init__"))
    return sorted(found)


def all_templates():
    """(label, template, original API or None) for every template: those attached to an
    API (first attachment) and those the template modules define without one."""
    for module in registration_modules():
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - optional backends may not import here
            pass
    seen, out = set(), []
    for original, template, label in _TRACE_REGISTRY:
        if id(template) not in seen:
            seen.add(id(template))
            out.append((label, template, original))
    templates = importlib.import_module("flashinfer.trace.templates")
    for info in sorted(os.listdir(os.path.dirname(templates.__file__))):
        if not info.endswith(".py") or info.startswith("_"):
            continue
        module = importlib.import_module(f"flashinfer.trace.templates.{info[:-3]}")
        for value in vars(module).values():
            if isinstance(value, TraceTemplate) and id(value) not in seen:
                seen.add(id(value))
                out.append((reference.template_name(value), value, None))
    return out


def init_kwargs(template):
    accepted = inspect.signature(template.init).parameters
    out = {}
    for axis, marker in template.axes.items():
        if isinstance(marker, Var):
            out[axis] = VAR_VALUES.get(axis, 4)
        elif axis in accepted and axis in CONST_VALUES:
            out[axis] = CONST_VALUES[axis]
    return {k: v for k, v in out.items() if k in accepted}


def init_sizes(template):
    """The init's keyword arguments to try: the small shapes, then (where the small ones
    break one of the init's constraints) the init's own sizes for its constant axes."""
    small = init_kwargs(template)
    var_only = {k: v for k, v in small.items() if isinstance(template.axes[k], Var)}
    return [small] if var_only == small else [small, var_only]


def unwrapped(function):
    while hasattr(function, "__wrapped__"):
        function = function.__wrapped__
    return function


def method_of(original, name):
    """The undecorated method ``name`` of ``original``'s class."""
    owner = sys.modules[original.__module__]
    for part in original.__qualname__.split(".")[:-1]:
        owner = vars(owner)[part]
    return unwrapped(vars(owner)[name])


def reference_outputs(template, original, explicit, defaults, plan_calls):
    """The reference's outputs for these arguments, by the mapping replay uses."""
    arguments = reference.CallArguments(explicit, defaults, plan_calls)
    args, kwargs = reference.reference_arguments(template, arguments, bool(plan_calls))
    with torch.no_grad():
        return template.reference(*args, **kwargs)


def as_returned(template, original, explicit, out):
    """The outputs as the API returns them: nothing when it returns None (in place),
    optional outputs only when asked for (``return_lse``), one tensor alone."""
    if inspect.signature(original).return_annotation in (None, "None"):
        return None
    if isinstance(out, (tuple, list)):
        names = list(template.outputs)
        kept = [
            item
            for i, item in enumerate(out)
            if i >= len(names)
            or not getattr(template.outputs[names[i]], "optional", False)
            or explicit.get(f"return_{names[i]}")
        ]
        return kept[0] if len(kept) == 1 else tuple(kept)
    return out


def new_dirs(before):
    return sorted(set(os.listdir(DUMP_ROOT)) - before - {"session.jsonl"})


def record(label, template, original, keep_alive):
    if original is None:
        return {"reason": "not attached to any API"}
    if template.init is None:
        return {"reason": "no init"}
    if template.reference is None:
        return {"reason": "no reference"}
    for sizes in init_sizes(template):
        try:
            made = template.init(device="cpu", seed=0, **sizes)
            break
        except Exception as exc:  # noqa: BLE001 - the reason is the finding
            failure = f"init fails on CPU: {type(exc).__name__}: {reference.first_line(exc)}"
    else:
        return {"reason": failure}
    return record_with(label, template, original, keep_alive, made)


def record_with(label, template, original, keep_alive, made):
    wrapper = isinstance(made, dict) and set(made) == {"plan", "run"}
    run_args = made["run"] if wrapper else made
    plan_calls = []
    before = set(os.listdir(DUMP_ROOT)) if os.path.isdir(DUMP_ROOT) else set()
    owner = original.__qualname__.split(".")[0] if "." in original.__qualname__ else None
    self_obj = type(owner, (), {})() if owner else None
    keep_alive.append(self_obj)
    try:
        if wrapper:
            plan = method_of(original, "plan")
            bound = inspect.signature(plan).bind_partial(self_obj, **made["plan"])
            explicit, defaults = reference.bind_arguments(plan, [self_obj], made["plan"], label)
            flashinfer_api(functools.wraps(plan)(lambda *a, **k: None))(*bound.args, **bound.kwargs)
            plan_calls = [(explicit, defaults)]
        call_args = [self_obj] if owner else []
        explicit, defaults = reference.bind_arguments(original, call_args, run_args, label)

        # The reference runs inside the call, after the recorder saved the inputs, as
        # a kernel would: a reference that updates a state in place changes no input.
        def compute(*_args, **_kwargs):
            out = reference_outputs(template, original, explicit, defaults, plan_calls)
            return as_returned(template, original, explicit, out)

        flashinfer_api(functools.wraps(original)(compute))(*call_args, **run_args)
    except Exception as exc:  # noqa: BLE001 - the reason is the finding
        return {
            "reason": f"reference fails on the init's inputs: {type(exc).__name__}: "
            f"{reference.first_line(exc)}",
            "dirs": new_dirs(before),
        }
    return {"dirs": new_dirs(before)}


def main():
    manifest = {}
    keep_alive = []
    torch.manual_seed(0)
    for label, template, original in all_templates():
        key = label
        n = 2
        while key in manifest:
            key, n = f"{label}#{n}", n + 1
        entry = record(label, template, original, keep_alive)
        if original is not None:
            entry["api"] = f"{original.__module__}.{original.__qualname__}"
            entry["module"] = original.__module__
        entry["label"] = label
        manifest[key] = entry
    with open("manifest.json", "w") as f:
        json.dump(manifest, f, indent=1)
    print("{}")


main()
