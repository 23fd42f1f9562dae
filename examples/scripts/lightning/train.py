"""Train LitModel with a Lightning Trainer (fast_dev_run runs one batch)."""

import argparse

import lightning as L

from lit import LitModel

parser = argparse.ArgumentParser()
parser.add_argument("--fast_dev_run", type=int, default=0)
parser.add_argument("--max_epochs", type=int, default=10)
args = parser.parse_args()

model = LitModel()
trainer = L.Trainer(fast_dev_run=args.fast_dev_run, max_epochs=args.max_epochs, accelerator="cpu", devices=1,
                    logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(model)
