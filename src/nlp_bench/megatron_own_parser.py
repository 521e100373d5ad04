"""Megatron-LM's own argument parser, run inside a checkout: its flag table, or its verdict on arguments.

This file is a script, not a module of nlp-bench: `bench` runs it with the Python of the site's Megatron-LM
environment (`python megatron_own_parser.py flags CHECKOUT` or `... check CHECKOUT -- ARGS`), so it imports only the
standard library and the checkout. Nothing is launched: the parser is built and, for `check`, Megatron-LM's
`parse_args()` and `validate_args()` run on CPU with the GPU-architecture queries answered as the GPU named
by --gpu (an A100 by default, the reference's), in the environment the caller gives (the jobscript's
exports: validate_args reads some). It prints one JSON object on stdout and exits 0, or exits 2 with
Megatron-LM's own message on stderr. `... serve CHECKOUT` answers many checks, one JSON line each, on one
import of the checkout: importing a current Megatron-LM costs about 10 s of CPU, a check milliseconds.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import importlib
import io
import json
import os
import re
import sys
import types
import typing

#: the GPUs whose architecture the checks can answer for: name -> (compute capability, memory in GiB)
GPUS = {"a100": ((8, 0), 40), "h100": ((9, 0), 80), "h200": ((9, 0), 141), "gh200": ((9, 0), 96),
        "b200": ((10, 0), 180)}
#: where a checkout defines its arguments, newest layout first (megatron/arguments.py until 2024)
ARGUMENT_MODULES = ("megatron.training.arguments", "megatron.arguments")
#: how Megatron-LM's help texts mark a flag itself as deprecated ("Deprecated: use ...", "[DEPRECATED] ...",
#: "DEPRECATED and replaced by ..."), as opposed to a help that mentions a deprecated choice
DEPRECATED = re.compile(r"^\W*deprecated\b|\bdeprecated\s*[:.]\s*(use|see)\b|\bdeprecated and\b", re.IGNORECASE)


class _Built(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__("parser built")
        self.parser = parser


def _prepare(checkout: str, gpu: str) -> types.ModuleType:
    """Import the checkout's argument module on this interpreter, with what a CPU-only machine lacks."""
    if not hasattr(typing, "override"):  # current Megatron-LM wants Python 3.12's typing.override
        typing.override = lambda func: func  # type: ignore[attr-defined]
    import torch  # Megatron-LM needs torch to import at all

    capability, memory_gib = GPUS[gpu]
    props = types.SimpleNamespace(major=capability[0], minor=capability[1], name=f"NVIDIA {gpu.upper()}",
                                  total_memory=memory_gib << 30, multi_processor_count=132)
    torch.cuda.get_device_capability = lambda *a, **k: capability
    torch.cuda.get_device_properties = lambda *a, **k: props
    sys.path.insert(0, checkout)
    last: Exception | None = None
    for name in ARGUMENT_MODULES:
        if not os.path.isfile(os.path.join(checkout, *name.split(".")) + ".py"):
            continue
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                return importlib.import_module(name)
            except ImportError as exc:
                last = exc
    raise SystemExit(f"cannot import Megatron-LM's arguments from {checkout}: "
                     f"{last or 'neither megatron/training/arguments.py nor megatron/arguments.py'}")


def _text(value: object) -> object:
    if isinstance(value, enum.Enum):
        return value.name  # what a user types (Megatron-LM's enum flags take the member's name)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_text(v) for v in value]
    return getattr(value, "__name__", None) or str(value)


def _flags(module: types.ModuleType) -> list[dict[str, object]]:
    def built(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise _Built(self)

    argparse.ArgumentParser.parse_args = built  # type: ignore[method-assign]
    argparse.ArgumentParser.parse_known_args = built  # type: ignore[method-assign]
    try:
        module.parse_args(ignore_unknown_args=False)
    except _Built as done:
        parser = done.parser
    else:
        raise SystemExit("Megatron-LM's parse_args() returned without building a parser")
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        switch = isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction,
                                     argparse._StoreConstAction))
        deprecated = (bool(getattr(action, "deprecated", False)) or "deprecated" in action.dest
                      or bool(DEPRECATED.search(action.help or "")))
        for name in action.option_strings:
            if not name.startswith("--"):
                continue
            out.append({"name": name[2:], "dest": action.dest,
                        "type": "switch" if switch else getattr(action.type, "__name__", None) or "str",
                        "nargs": action.nargs if isinstance(action.nargs, (str, int)) else None,
                        "choices": None if action.choices is None else [_text(c) for c in action.choices],
                        "default": _text(action.default), "deprecated": deprecated})
    return sorted(out, key=lambda f: f["name"])


def _check(module: types.ModuleType, argv: list[str], world_size: int) -> dict[str, object]:
    os.environ.setdefault("RANK", "0")
    os.environ["WORLD_SIZE"] = str(world_size)
    sys.argv = ["pretrain_gpt.py", *argv]
    with contextlib.redirect_stdout(sys.stderr):
        args = module.parse_args()
        module.validate_args(args)
    return {"parsed": len([w for w in argv if w.startswith("--")]), "world_size": args.world_size,
            "data_parallel_size": getattr(args, "data_parallel_size", None),
            # the expert layout as Megatron-LM took it (validate_args sets expert tp to tp where not given)
            "expert_model_parallel_size": getattr(args, "expert_model_parallel_size", None),
            "expert_tensor_parallel_size": getattr(args, "expert_tensor_parallel_size", None)}


def _serve(module: types.ModuleType) -> int:
    """Answer each line of stdin, {"argv": [...], "world_size": N, "env": {...}}, with one line on stdout:
    {"ok": true, "answer": ...} or {"ok": false, "error": Megatron-LM's message}. Each check runs in the
    environment it names on top of this process's own, which is put back afterwards."""
    out = sys.stdout
    base = dict(os.environ)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        os.environ.clear()
        os.environ.update({**base, **request.get("env", {})})
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said):
                reply = {"ok": True, "answer": _check(module, request["argv"], request.get("world_size", 1))}
        except (AssertionError, ValueError, TypeError, KeyError) as exc:
            reply = {"ok": False, "error": f"validate_args: {type(exc).__name__}: {exc}"}
        except SystemExit:  # argparse's own error: its message went to stderr
            reply = {"ok": False, "error": said.getvalue().strip()}
        finally:
            os.environ.clear()
            os.environ.update(base)
        out.write(json.dumps(reply) + "\n")
        out.flush()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("flags", "check", "serve"))
    parser.add_argument("checkout")
    parser.add_argument("--gpu", choices=sorted(GPUS), default="a100")
    parser.add_argument("--world-size", type=int, default=1, help="WORLD_SIZE for validate_args (check)")
    words = sys.argv[1:]
    cut = words.index("--") if "--" in words else len(words)  # after --: the trainer's arguments (check)
    ns = parser.parse_args(words[:cut])
    module = _prepare(os.path.abspath(ns.checkout), ns.gpu)
    if ns.what == "serve":
        return _serve(module)
    if ns.what == "flags":
        result: object = _flags(module)
    else:
        try:
            result = _check(module, words[cut + 1:], ns.world_size)
        except (AssertionError, ValueError, TypeError, KeyError) as exc:  # validate_args says no by asserting
            print(f"validate_args: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 2
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
