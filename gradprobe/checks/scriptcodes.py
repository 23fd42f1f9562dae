"""Finding codes of script targets (gradprobe.scripts), collected by gradprobe.findings."""

RULES = {
    "GP112": {
        "name": "no-training-step",
        "severity": "error",
        "summary": "A script target ran until its timeout (or ended) without reaching a backward/optimizer step.",
        "why": "gradprobe checks the script's first real training step; a script that exits, fails, loops or is stopped before it gives nothing to check.",
        "example": "if not args.data: sys.exit('usage: train.py --data DIR')  # exits before training",
        "fix": "Run the script with arguments that reach the first optimizer.step() within the timeout.",
    },
}
