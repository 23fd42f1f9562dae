"""One module per tool: its options, its description for the model reading it, and the call."""

from gradprobe.server.tools import (
    check_optimizer_coverage,
    diagnose,
    inspect_parameters,
    run_gradcheck,
    trace_grad_path,
    verify_prompt_tuning,
)

MODULES = (inspect_parameters, check_optimizer_coverage, run_gradcheck, trace_grad_path, verify_prompt_tuning, diagnose)


def register_all(server, runtime) -> None:
    for module in MODULES:
        module.register(server, runtime)
