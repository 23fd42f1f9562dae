"""The text-to-image LoRA loop of several_t2i_lora with one bug: the text encoder gets its LoRA adapters and they
require grad, but the optimizer is built from the UNet's adapters only. The text encoder's adapters get a gradient at
every step and never move, and nothing raises.

Written from hpcaitech/ColossalAI issue #3146 (https://github.com/hpcaitech/ColossalAI/issues/3146, "text_encoder was
not finetuned with train_dreambooth_colossalai.py": only the UNet's parameters were given to the optimizer, so the
text encoder's weights never changed although it was made trainable).

    python train.py --max_train_steps 100
"""

import argparse

import torch
import torch.nn.functional as F
from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
from peft import LoraConfig, inject_adapter_in_model
from transformers import CLIPTextConfig, CLIPTextModel

parser = argparse.ArgumentParser()
parser.add_argument("--max_train_steps", type=int, default=100)
parser.add_argument("--rank", type=int, default=4)
parser.add_argument("--learning_rate", type=float, default=1e-4)
parser.add_argument("--text_encoder_lr", type=float, default=5e-5)
args = parser.parse_args()
torch.manual_seed(0)


def load_text_encoder():
    config = CLIPTextConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                            num_attention_heads=2, max_position_embeddings=16, bos_token_id=0, eos_token_id=1)
    text_encoder = CLIPTextModel(config)
    text_encoder.requires_grad_(False)
    # text_encoder.add_adapter(text_lora_config) in diffusers' script; peft's own call, which add_adapter wraps
    lora = LoraConfig(r=args.rank, lora_alpha=args.rank, init_lora_weights="gaussian",
                      target_modules=["q_proj", "k_proj", "v_proj", "out_proj"])
    return inject_adapter_in_model(lora, text_encoder)


vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
                    up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), block_out_channels=(8, 16),
                    latent_channels=4, norm_num_groups=4, layers_per_block=1, sample_size=16)
unet = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(8, 16),
                            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=16,
                            attention_head_dim=2, norm_num_groups=4)
text_encoder = load_text_encoder()
noise_scheduler = DDPMScheduler(num_train_timesteps=1000)
vae.requires_grad_(False)
unet.requires_grad_(False)
unet.add_adapter(LoraConfig(r=args.rank, lora_alpha=args.rank, init_lora_weights="gaussian",
                            target_modules=["to_k", "to_q", "to_v", "to_out.0"]))

unet_lora_parameters = [p for p in unet.parameters() if p.requires_grad]
text_lora_parameters = [p for p in text_encoder.parameters() if p.requires_grad]
optimizer = torch.optim.AdamW(unet_lora_parameters, lr=args.learning_rate, weight_decay=1e-2)

for _step in range(args.max_train_steps):
    pixel_values = torch.randn(2, 3, 16, 16)
    input_ids = torch.randint(2, 100, (2, 8))
    latents = vae.encode(pixel_values).latent_dist.sample() * vae.config.scaling_factor
    noise = torch.randn_like(latents)
    timesteps = torch.randint(0, noise_scheduler.config.num_train_timesteps, (latents.shape[0],))
    noisy_latents = noise_scheduler.add_noise(latents, noise, timesteps)
    encoder_hidden_states = text_encoder(input_ids, return_dict=False)[0]
    model_pred = unet(noisy_latents, timesteps, encoder_hidden_states, return_dict=False)[0]
    loss = F.mse_loss(model_pred.float(), noise.float(), reduction="mean")
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
