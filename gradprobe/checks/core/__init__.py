"""What every family of checks shares: nothing here knows a finding code.

    torchcompat     every private torch API gradprobe uses and every torch message it matches, in one place
    step            the one step runner (forward, loss, backward as the target defines them) and its helpers
    loss_parts      a loss_fn that returns several terms: the total a trainer would take, and the terms
    function_calls  custom autograd.Function calls watched during a step (and where a Function's backward sits)
    watches         patch-and-restore, and the watches the recording mode enters during a step
    rule_text       phrases the messages share (a capped list of names, "line N of file.py")
"""
