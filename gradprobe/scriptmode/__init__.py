"""Script mode, a loader on the child's side beside the `build_model()` loader (gradprobe/loading.py): run the
user's own training script (or `python -m` module) until its first step, watching its real steps (optimizer,
autograd, modules, ranks) as they happen, then check that step in place.

    first_step.py  the tool call on a script target: run, check the captured step, report
    checked_step.py the checks on the captured step, replayed in place (first_step.py's and audit.py's)
    run.py         run the script as __main__ under a timer; GP112 when it reaches no step
    observe.py     the watch: module calls, backwards, optimizer steps, as they happen
    step.py        replay the captured step for the checks (after the script's own step ran; a failure is left out)
    audit.py       audit_training on a script: watch its own optimizer steps, stop before step N+1, judge them
                   (diagnose with steps: the same run, then diagnose's checks on step N+1)
    watch_steps.py the audit's observer: the GP6xx StepObserver over the whole script run, no replay
    owners.py      several optimizers in the script's loop: GP212/GP213's watch (checks/steps/optimizer_owners.py)
    ranks.py       several ranks in one call: `world_size` > 1 (torchrun-style forked ranks) and workers the script
                   starts with torch.multiprocessing.spawn; each rank runs first_step.py's job
    rankwatch.py   what each rank measures for the checks across ranks (gradprobe/checks/ranks/rules.py)
    rankmerge.py   the ranks' reports merged (each finding says its ranks) and the checks across ranks
    paired.py      check_equivalence on a script (or a build_model() target at N ranks): the setup under test and
                   its reference, each in processes forked from the child; feeds.py plans what the reference is fed
    pairwatch.py   what one process of a paired run records or is fed (batches, weights, gradients, losses);
                   callfeed.py feeds batches made without a DataLoader at the model's and the loss's calls,
                   ddpsync.py records DDP's sync flag per micro-batch, dtensors.py gathers FSDP2's shards whole,
                   knobs.py sets the frameworks' own accumulation and device settings for the reference
    launchers.py   a launcher script that starts torchrun, and mp.spawn, followed in the paired runs
"""
