"""Fine-tune SoftPromptLM with the Hugging Face Trainer.

    python train.py --max_steps=1
"""

import argparse

import torch
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments

from prompt_model import SoftPromptLM

parser = argparse.ArgumentParser()
parser.add_argument("--max_steps", type=int, default=100)
parser.add_argument("--warmup_steps", type=int, default=0)
parser.add_argument("--output_dir", default="out")
args = parser.parse_args()


class RandomText(Dataset):
    def __init__(self, n=32, length=12):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 64, (n, length), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        ids = self.ids[i]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


model = SoftPromptLM()
training_args = TrainingArguments(output_dir=args.output_dir, max_steps=args.max_steps, warmup_steps=args.warmup_steps,
                                  per_device_train_batch_size=4, learning_rate=1e-3, report_to=[], save_strategy="no",
                                  logging_steps=10, use_cpu=True, dataloader_num_workers=0)
trainer = Trainer(model=model, args=training_args, train_dataset=RandomText())
trainer.train()
