"""Command line: `gradprobe serve` for MCP hosts, `gradprobe diagnose` and friends for people and CI."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any, NoReturn

from gradprobe.serve_command import server_command
from gradprobe.tools import TOOLS

if TYPE_CHECKING:
    from gradprobe.sandbox.runner import Limits
    from gradprobe.server.options import ServeOptions
    from gradprobe.target import Target


def _target_from_args(args: argparse.Namespace) -> dict:
    """Flags to a target: FILE's directory is the project unless --project-dir says otherwise."""
    import os

    if args.script or args.module:
        return _script_target(args)
    project = os.path.abspath(args.project_dir or (os.path.dirname(os.path.abspath(args.file)) if args.file else "."))
    rel = os.path.relpath(os.path.abspath(args.file), project) if args.file else None

    def ref(name: str | None) -> str | None:
        if name is None or ":" in name or rel is None:
            return name
        return f"{rel}:{name}"

    target = {"project_dir": project, "model": ref(args.model) if args.model else rel, "device": args.device,
              "seed": args.seed, "timeout_s": args.timeout, "setup": args.setup, "world_size": args.world_size,
              **_common(args)}
    for field in ("inputs", "loss", "optimizer", "train_step"):
        target[field] = ref(getattr(args, field))
    if not (args.project_dir or args.file) and args.model and os.path.isabs(args.model):
        del target["project_dir"]  # an absolute --model file: its directory is the project
    return {k: v for k, v in target.items() if v is not None}


def _script_target(args: argparse.Namespace) -> dict:
    """--script FILE / --module MOD, and the script's own arguments after `--`. The project is the directory the command
    is run from, as `python scripts/run.py ARGS` runs there (its working directory: relative paths in ARGS and in the
    script resolve against it); a script outside it has its own directory as the project."""
    import os

    project = os.path.abspath(args.project_dir or _run_from(args.script))
    target = {"project_dir": project, "args": list(args.script_args), "device": args.device, "seed": args.seed,
              "timeout_s": args.timeout, "world_size": args.world_size, **_common(args)}
    if args.script:
        target["script"] = os.path.relpath(os.path.abspath(args.script), project)
    else:
        target["module"] = args.module
    return {k: v for k, v in target.items() if v is not None}


def _run_from(script: str | None) -> str:
    """The project of a script run from the command line: the working directory when the script is inside it, else the
    project the script belongs to (gradprobe.target.project_root_of: the sandbox shows the child the project only)."""
    import os

    from gradprobe.target import project_root_of

    cwd = os.getcwd()
    if not script:
        return cwd
    path = os.path.realpath(os.path.abspath(script))
    return cwd if path.startswith(os.path.realpath(cwd).rstrip(os.sep) + os.sep) else project_root_of(path)


def _common(args: argparse.Namespace) -> dict:
    """Fields every target form shares. A relative --python is made absolute against this directory (the server,
    which has no directory of the caller's, refuses one)."""
    import os

    python = args.python
    if python and python != "server":
        python = os.path.abspath(python)
    env = dict(item.partition("=")[::2] for item in args.env or [])
    reads = [os.path.abspath(os.path.expanduser(p)) for p in args.read_path or []]
    return {"python": python, "read_paths": reads or None, "env": env or None, "memory_gb": args.memory_gb}


def _fail(args: argparse.Namespace, kind: str, message: str, code: int) -> int:
    """An error the user can act on: one line on stderr (terminal control characters removed: the text may come from
    the user's code, e.g. a tool error its child wrote), or a JSON error object on stdout with --json."""
    if getattr(args, "json", False):
        print(json.dumps({"ok": False, "tool": args.command, "error": {"kind": kind, "message": message}}, indent=1))
    else:
        from gradprobe.render import clean

        print(f"gradprobe: {clean(message)}", file=sys.stderr)
    return code


def _run_check(args: argparse.Namespace) -> int:
    import anyio
    from pydantic import ValidationError

    from gradprobe.render import clean, render_text
    from gradprobe.errors import ToolInputError
    from gradprobe.target import Target, explain_validation_error

    try:
        target = Target.model_validate(_target_from_args(args))
    except ValidationError as exc:
        return _fail(args, "bad-target", f"bad target: {explain_validation_error(exc)}", 2)
    options: dict[str, Any] = {}
    if args.command == "check_optimizer_coverage":
        options["step"] = not args.no_step
    if getattr(args, "steps", None):
        options["steps"] = args.steps
    if getattr(args, "overfit_steps", None):
        options["overfit_steps"] = args.overfit_steps
    if getattr(args, "positions", None):
        options["positions"] = args.positions
    if getattr(args, "checks", None):
        options["checks"] = [c.strip() for c in args.checks.split(",") if c.strip()]
    if args.command == "diagnose":
        options["compare"] = bool(args.compare)  # as over MCP: when off, the report says the comparisons did not run
    if args.command == "check_equivalence":
        import shlex

        options.update(compare=list(args.compare or []),
                       reference={"args": shlex.split(args.reference_args)} if args.reference_args else {})
    from gradprobe.sandbox.runner import Limits
    from gradprobe.server.options import default_memory_bytes

    try:
        report = anyio.run(lambda: _execute_settled(args.command, target, options, Limits(memory_bytes=default_memory_bytes())))
    except ToolInputError as exc:
        return _fail(args, "bad-target", str(exc), 2)
    except Exception as exc:  # a gradprobe bug: exit 3, never mistaken for a finding (1); JSON with --json
        if not args.json:
            import traceback

            traceback.print_exc()
        return _fail(args, "internal-error", f"gradprobe failed (a gradprobe bug): {type(exc).__name__}: {exc}", 3)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(render_text(report, color=sys.stdout.isatty() and not args.no_color))
        flow = (report.get("facts") or {}).get("flow")
        if flow and args.mermaid:
            from gradprobe.flowchart import flow_mermaid

            print("\n" + clean(flow_mermaid(flow)))
        _print_steps(report)
    return exit_code(report)


def exit_code(report: dict) -> int:
    """0 verified, 1 problems found, 4 partly checked or not checked (docs/verdicts.md); 2 and 3 are the command's own."""
    status = (report.get("verdict") or {}).get("status")
    return {"verified": 0, "problems": 1}.get(str(status), 4)


def _print_steps(report: dict) -> None:
    """The per-term table of overfit one batch, and the per-group table of the observed steps (lr, grad norm, update
    ratio per step), when they ran."""
    from gradprobe.render import clean
    from gradprobe.stepchart import overfit_table, steps_table

    facts = report.get("facts") or {}
    terms = (facts.get("overfit_one_batch") or {}).get("terms")
    if isinstance(terms, dict) and terms:
        print("\noverfit one batch, per loss term:\n" + clean(overfit_table(terms)))
    steps = facts.get("steps") if isinstance(facts.get("steps"), dict) else facts
    groups = steps.get("param_groups") if isinstance(steps, dict) else None
    if isinstance(groups, list) and groups:
        print("\nper parameter group, per optimizer step:\n" + clean(steps_table(groups)))


def _refuse_serve_args(args: argparse.Namespace) -> None:
    """Serving flags that would open a hole are refused before anything starts (exit 2, the reason on stderr)."""
    import os

    from gradprobe.envrules import refused

    for root in args.allow_root or ():
        if os.path.realpath(root) == "/":
            _exit_usage(f"--allow-root {root}: '/' would let callers read the whole machine; name the code's own directory")
    for name in args.allow_env:
        why = refused(name)
        if why:
            _exit_usage(f"--allow-env {name}: {why.removeprefix('env: ')}, whatever the operator allows")


def _exit_usage(message: str) -> NoReturn:
    print(f"gradprobe: {message}", file=sys.stderr)
    sys.exit(2)


def serve_options(args: argparse.Namespace) -> ServeOptions:
    """The one place serving flags become typed options (gradprobe.server.options.ServeOptions)."""
    from gradprobe.sandbox.runner import Limits
    from gradprobe.server.options import HttpOptions, ServeOptions

    _refuse_serve_args(args)
    http = None
    if args.http:
        http = HttpOptions(host=args.host, port=args.port, token_file=args.token_file, insecure_no_auth=args.insecure_no_auth,
                           allowed_hosts=tuple(args.allowed_host), allowed_origins=tuple(args.allowed_origin),
                           max_body=args.max_body, public_url=args.public_url, issuer_url=args.issuer_url,
                           max_connections=args.max_connections, header_timeout_s=args.header_timeout,
                           body_timeout_s=args.body_timeout)
    import os

    from gradprobe.server.options import memory_settings

    memory = memory_settings(args.max_concurrent or os.cpu_count() or 2, args.memory_gb, args.max_memory_gb,
                             args.memory_budget_gb, local=args.executor == "local")
    if isinstance(memory, str):
        _exit_usage(memory)
    per_call, ceiling, budget = memory
    limits = Limits(memory_bytes=per_call, isolate=not args.no_isolation, require_isolation=args.require_isolation)
    if args.executor == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            sys.exit("gradprobe: --executor ray needs Ray: pip install 'gradprobe[ray]'")
    return ServeOptions(max_concurrent=args.max_concurrent, per_caller=args.per_caller, warm=not args.cold,
                        allowed_roots=tuple(args.allow_root or ()), allowed_pythons=tuple(args.allow_python), limits=limits,
                        allowed_env=tuple(args.allow_env),
                        max_memory_bytes=ceiling, memory_budget_bytes=budget,
                        executor=args.executor, ray_address=args.ray_address, http=http)


class _Parser(argparse.ArgumentParser):
    """With --json on the command line, even a usage error is a JSON error object."""

    json_errors = False

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        if _Parser.json_errors:
            tool = self.prog.split()[-1]
            print(json.dumps({"ok": False, "tool": tool, "error": {"kind": "usage", "message": message}}, indent=1))
            sys.exit(2)
        super().error(message)


async def _execute_settled(tool: str, target: Target, options: dict, limits: Limits) -> dict:
    """One call, then what it left running after its reply (the child's exit): the loop closes with nothing watched."""
    from gradprobe.sandbox.call import execute
    from gradprobe.sandbox.runner import settle

    report = await execute(tool, target, options, limits=limits)
    await settle()
    return report


def main(argv: list[str] | None = None) -> None:
    """The command line; a reader that goes away (`gradprobe diagnose ... | head`) ends it quietly."""
    try:
        _main(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's own flush at exit must not fail again
        sys.exit(1)


def _tool_options(p: argparse.ArgumentParser, tool: str) -> None:
    """The options only some tools take."""
    if tool == "check_optimizer_coverage":
        p.add_argument("--no-step", action="store_true")
    if tool in ("diagnose", "audit_training"):
        p.add_argument("--steps", type=int, default=None if tool == "diagnose" else 4, metavar="N",
                       help="run N real training steps, observed (diagnose: 0 = one step only)")
    if tool == "check_dependencies":
        p.add_argument("--positions", type=int, default=None, metavar="N",
                       help="output positions to sample for causality (default 5)")
        p.add_argument("--checks", default=None, metavar="LIST",
                       help="comma-separated: causality,examples,packed,packed_vs_padded (default: all that apply)")
    if tool == "diagnose":
        p.add_argument("--compare", action="store_true",
                       help="also run check_equivalence's comparisons that apply (a second run of the script)")
    if tool == "check_equivalence":
        p.add_argument("--compare", action="append", default=None, metavar="NAME",
                       help="a comparison to run (ranks, accumulation, ...; repeatable; default: all that apply)")
        p.add_argument("--steps", type=int, default=2, metavar="N", help="optimizer steps compared (2-8)")
        p.add_argument("--reference-args", dest="reference_args", default=None, metavar="ARGS",
                       help='the reference run\'s extra script arguments, e.g. --reference-args="--grad-accum 1"')
    if tool == "audit_training":
        p.add_argument("--overfit-steps", dest="overfit_steps", type=int, default=0, metavar="K",
                       help="also run K steps on one fixed batch and check that the loss goes down (e.g. 20)")


def _main(argv: list[str] | None = None) -> None:
    _Parser.json_errors = "--json" in (sys.argv[1:] if argv is None else argv)
    parser = _Parser(prog="gradprobe", description="Measure why gradients do not flow in PyTorch code.")
    sub = parser.add_subparsers(dest="command")
    serve = sub.add_parser("serve", help="run the MCP server (stdio by default)")
    serve.add_argument("--max-concurrent", type=int, default=None, help="checks running at once (default: cores)")
    serve.add_argument("--cold", action="store_true", help="no warm worker: every call starts a fresh interpreter")
    serve.add_argument("--allow-root", action="append", default=None, metavar="DIR",
                       help="only targets under DIR (repeatable); default over HTTP: the working directory; over stdio: no limit")
    serve.add_argument("--require-isolation", action="store_true",
                       help="refuse to run user code when an isolation layer (namespaces, Landlock, capabilities, cgroups) "
                            "is missing")
    serve.add_argument("--no-isolation", action="store_true", help="only the process boundary, limits and a scrubbed environment")
    serve.add_argument("--memory-gb", type=float, default=None,
                       help="memory limit of each check (cgroup; address space on CPU runs); default: the memory budget "
                            "over the checks that may run at once (--max-concurrent)")
    serve.add_argument("--max-memory-gb", type=float, default=None,
                       help="the most a target may ask for with memory_gb (default: the whole memory budget)")
    serve.add_argument("--memory-budget-gb", type=float, default=None,
                       help="the memory all checks together may hold (one cgroup bounds them; a check that asks for more "
                            "than is free waits); default: the machine's (or this server's cgroup's) memory less a quarter "
                            "for the server")
    serve.add_argument("--allow-env", action="append", default=[], metavar="NAME",
                       help="an environment variable a target's `env` may set over HTTP (repeatable; over stdio any may)")
    serve.add_argument("--executor", choices=["local", "ray"], default="local", help="where sandboxed jobs run")
    serve.add_argument("--ray-address", default="local",
                       help="Ray cluster address ('auto', 'ray://host:10001'); 'local' starts one here")
    serve.add_argument("--allow-python", action="append", default=[], metavar="PATH",
                       help="an interpreter targets may name (repeatable; its environment and file must match); with "
                            "--allow-root or over HTTP, no other is accepted, and a project's own only inside a root")
    http = serve.add_argument_group("Streamable HTTP (for teams)")
    http.add_argument("--http", action="store_true", help="serve Streamable HTTP instead of stdio")
    http.add_argument("--host", default="127.0.0.1")
    http.add_argument("--port", type=int, default=8765)
    http.add_argument("--token-file", default=None, help="one user:token per line (else GRADPROBE_TOKENS=user:token,...)")
    http.add_argument("--insecure-no-auth", action="store_true", help="allow a non-loopback bind without tokens")
    http.add_argument("--allowed-host", action="append", default=[],
                      help="Host header values to accept (DNS-rebinding protection)")
    http.add_argument("--allowed-origin", action="append", default=[], help="Origin header values to accept")
    http.add_argument("--per-caller", type=int, default=None,
                      help="running checks per caller (default: half the pool, at least 1)")
    http.add_argument("--max-body", type=int, default=1024 * 1024, help="request body limit in bytes")
    http.add_argument("--max-connections", type=int, default=256, help="open connections at once (beyond: 503)")
    http.add_argument("--header-timeout", type=float, default=10.0, help="seconds a connection may take to send a request head")
    http.add_argument("--body-timeout", type=float, default=30.0,
                      help="seconds a request may take to send its body, from its head")
    http.add_argument("--public-url", default=None, help="the URL clients use (behind a TLS proxy), for the auth metadata")
    http.add_argument("--issuer-url", default=None,
                      help="the authorization server advertised to clients (default: the public URL)")
    sub.add_parser("demo", help="diagnose a bundled broken model through the real server and client")
    sub.add_parser("mcp-config", help="print a host config (claude_desktop_config.json) with the console script's full path")
    tool_parsers = {}
    for spec in TOOLS:
        tool = spec.name
        p = tool_parsers[tool] = sub.add_parser(tool, help=f"{spec.help} (prints the report)")
        p.add_argument("file", nargs="?", help="the user's file (e.g. train.py); its directory is the project")
        p.add_argument("--project-dir", default=None)
        p.add_argument("--model", default=None, help="callable in FILE building the model (default: build_model)")
        p.add_argument("--inputs", default=None)
        p.add_argument("--loss", default=None)
        p.add_argument("--optimizer", default=None)
        p.add_argument("--train-step", dest="train_step", default=None)
        p.add_argument("--setup", default=None, help="inline Python defining model/inputs/...")
        p.add_argument("--script", default=None, help="a training script run to its first step (its own arguments after --)")
        p.add_argument("--module", default=None, help="like --script, for a `python -m` entry point")
        p.add_argument("--python", default=None, metavar="PATH",
                       help="interpreter that runs the code (default: the project's .venv/venv/env/.pixi/conda environment "
                            "found from the project up, else this one); 'server' forces this one")
        p.add_argument("--read-path", action="append", default=None, metavar="PATH",
                       help="a file or directory the code may read besides the project (data, caches), read-only; repeatable")
        p.add_argument("--env", action="append", default=None, metavar="NAME=VALUE",
                       help="an environment variable for the code, e.g. WANDB_MODE=disabled; repeatable")
        p.add_argument("--memory-gb", type=float, default=None,
                       help="memory limit of the check (default: this machine's memory less a quarter)")
        p.add_argument("--device", default="cpu")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--timeout", type=float, default=120.0)
        p.add_argument("--world-size", type=int, default=None, help="run the target as this many ranks (2-4)")
        p.add_argument("--json", action="store_true", help="print the report as JSON")
        p.add_argument("--no-color", action="store_true")
        p.add_argument("--mermaid", action="store_true", help="also print the Mermaid flowchart (diagnose)")
        _tool_options(p, tool)
    argv = list(sys.argv[1:] if argv is None else argv)
    script_args: list[str] = []
    if "--" in argv:  # `gradprobe diagnose --script train.py -- --max_iters=1`
        cut = argv.index("--")
        argv, script_args = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv)
    args.script_args = script_args
    if args.command is None:
        args = parser.parse_args(["serve"])
    if args.command == "serve":
        options = serve_options(args)
        if options.http is not None:
            from gradprobe.server.http import serve_http

            sys.exit(serve_http(options))
        from gradprobe.server.app import serve_stdio

        serve_stdio(options)
        return
    if args.command == "mcp-config":
        # hosts start servers without the user's PATH or virtualenv: name this interpreter by its full path
        print(json.dumps({"mcpServers": {"gradprobe": server_command()}}, indent=2))
        return
    if args.command == "demo":
        from gradprobe.demo import run_demo

        sys.exit(run_demo())
    if not (args.file or args.setup or args.model or args.script or args.module):
        if args.json:
            sys.exit(_fail(args, "usage", f"give the file to check, e.g. `gradprobe {args.command} train.py`", 2))
        tool_parsers[args.command].print_help(sys.stderr)
        sys.exit(2)
    sys.exit(_run_check(args))
