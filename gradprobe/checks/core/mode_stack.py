"""Observers kept open across the user's own code, placed where the user's torch-function modes cannot unbalance them.

A watch that stays open between two events of the user's loop (from a backward to the optimizer step, from a step to
the next forward) is a TorchFunctionMode pushed in one hook and left in another. The user's code may enter and leave
its own modes in between: `with torch.device("meta"):` is one, and its exit pops whatever mode is on top of the stack
(torch's C implementation of `torch.device.__exit__`). A watch pushed on top inside such a block would be popped in its
place, leaving the meta device in force for everything the script creates afterwards ("Tensor on device cpu is not on
the expected device meta!" in a script that runs plainly: Fabric's `init_module(empty_init=True)`, a flop count on a
meta model, torchtitan-style init). So such a watch is entered beneath every mode on the stack, and left from wherever
it is, the modes above it put back in their order: the user's enter/exit pairs see the stack as they left it.
"""

from __future__ import annotations

from torch.overrides import TorchFunctionMode, _len_torch_function_stack, _pop_mode, _push_mode


def enter_beneath(mode: TorchFunctionMode) -> None:
    """Open `mode` at the bottom of the torch-function mode stack (beneath the modes the user's code has entered)."""
    above = [_pop_mode() for _ in range(_len_torch_function_stack())]  # top first
    _push_mode(mode)
    for m in reversed(above):
        _push_mode(m)


def leave(mode: TorchFunctionMode) -> bool:
    """Close `mode` wherever it is on the stack, the modes above it kept in their order; False when it is not there."""
    above = []
    found = False
    while _len_torch_function_stack():
        m = _pop_mode()
        if m is mode:
            found = True
            break
        above.append(m)
    for m in reversed(above):
        _push_mode(m)
    return found
