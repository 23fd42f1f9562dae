"""Train LitModel with a Lightning Trainer (fast_dev_run runs one batch)."""

import argparse

import lightning as L

from lit import LitModel

parser = argparse.ArgumentParser()
parser.add_argument("--fast_dev_run", type=int, default=0)
parser.add_argument("--max_epochs", type=int, default=10)
parser.add_argument("--devices", type=int, default=1)  # 2 with --strategy ddp under torchrun (world size 2)
parser.add_argument("--strategy", default="auto")
args = parser.parse_args()

model = LitModel()
trainer = L.Trainer(fast_dev_run=args.fast_dev_run, max_epochs=args.max_epochs, accelerator="cpu", devices=args.devices,
                    strategy=args.strategy,
                    logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(model)
