"""Padding-free fine-tuning with the Hugging Face Trainer: DataCollatorWithFlattening packs each batch into one row
with position_ids that restart; the Trainer sets model.config.use_cache from TrainingArguments (False by default), so
the training forward builds no cache and transformers' block-diagonal packed mask applies (healthy, measured). The
same model called with use_cache=True outside the Trainer would mix the packed examples (reported as info).

    python train.py --max_steps=1
"""

import argparse

import torch
from torch.utils.data import Dataset
from transformers import DataCollatorWithFlattening, LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

parser = argparse.ArgumentParser()
parser.add_argument("--max_steps", type=int, default=100)
parser.add_argument("--output_dir", default="out")
args = parser.parse_args()


class RandomText(Dataset):
    def __init__(self, n=32):
        g = torch.Generator().manual_seed(0)
        self.rows = [torch.randint(0, 96, (int(k),), generator=g).tolist() for k in torch.randint(4, 9, (n,), generator=g)]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i]}


torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64))
training_args = TrainingArguments(output_dir=args.output_dir, max_steps=args.max_steps, per_device_train_batch_size=3,
                                  learning_rate=1e-3, report_to=[], save_strategy="no", logging_steps=1,
                                  use_cpu=True, dataloader_num_workers=0)
trainer = Trainer(model=model, args=training_args, train_dataset=RandomText(),
                  data_collator=DataCollatorWithFlattening(return_tensors="pt"))
trainer.train()
