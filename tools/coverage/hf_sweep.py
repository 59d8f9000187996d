#!/usr/bin/env python3
"""Hugging Face sweep: exports small random-weight configs of common
transformers architectures (encoders, decoders, a mixture of experts, a
state-space model, vision and audio models)
through kiln.compile and reports, per model, the ops left to ExecuTorch's CPU
kernels with the reason Kiln gave for each, so that gaps outside the
benchmark models show up (a model that leaves an op on the CPU still runs:
those ops run on the CPU between engines).

    PYTHONPATH=python python3 tools/coverage/hf_sweep.py [--models gpt2,bart] \\
        [--markdown docs/coverage_hf.md] [--target-sms 90]

Configs are shrunk (2 layers, hidden 64-128, a 16-token prompt or a 64x64
image) so the whole sweep of 60 models takes about three minutes on the
2-core CPU machine; the ops a model uses do not depend on its size. Attention runs through SDPA
where the model offers it. Nothing is downloaded. Exit status 0 unless a
model aborted inside Kiln (an exception from kiln.compile): ops left to the
CPU are findings, not failures.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
import kiln  # noqa: E402


class LastHidden(torch.nn.Module):
    """The model's main output (last_hidden_state) as a plain tensor."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs):
        out = self.model(*inputs)
        return out["last_hidden_state"] if hasattr(out, "keys") else out[0]


def _config(cls, sdpa: bool = True, **kw):
    config = cls(**kw)
    if sdpa:
        config._attn_implementation = "sdpa"
    return config


def _ids(n: int = 16, vocab: int = 1000) -> torch.Tensor:
    return torch.randint(0, vocab, (1, n))


def _image() -> torch.Tensor:
    return torch.randn(1, 3, 64, 64)


def cases() -> dict:
    """name -> () -> (model, example inputs)."""
    import transformers as T

    text = dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, intermediate_size=256, vocab_size=1000)
    decoder = dict(text, use_cache=False)
    vision = dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, intermediate_size=256, image_size=64,
                  patch_size=16)
    return {
        "bert": lambda: (T.BertModel(_config(T.BertConfig, **text)), (_ids(),)),
        "roberta": lambda: (T.RobertaModel(_config(T.RobertaConfig, **text)), (_ids(),)),
        "xlm_roberta": lambda: (T.XLMRobertaModel(_config(T.XLMRobertaConfig, **text)), (_ids(),)),
        "distilbert": lambda: (T.DistilBertModel(_config(T.DistilBertConfig, n_layers=2, dim=128, n_heads=4,
                                                          hidden_dim=256, vocab_size=1000)), (_ids(),)),
        "albert": lambda: (T.AlbertModel(_config(T.AlbertConfig, embedding_size=64, **text)), (_ids(),)),
        "electra": lambda: (T.ElectraModel(_config(T.ElectraConfig, embedding_size=64, **text)), (_ids(),)),
        "deberta_v2": lambda: (T.DebertaV2Model(_config(T.DebertaV2Config, sdpa=False, **text)), (_ids(),)),
        "t5_encoder": lambda: (T.T5EncoderModel(_config(T.T5Config, num_layers=2, d_model=128, num_heads=4, d_ff=256,
                                                         d_kv=32, vocab_size=1000)), (_ids(),)),
        "bart": lambda: (T.BartModel(_config(T.BartConfig, encoder_layers=1, decoder_layers=1, d_model=64,
                                             encoder_attention_heads=4, decoder_attention_heads=4,
                                             encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=1000,
                                             max_position_embeddings=64)), (_ids(),)),
        "gpt2": lambda: (T.GPT2Model(_config(T.GPT2Config, n_layer=2, n_embd=128, n_head=4, vocab_size=1000,
                                             n_positions=64, use_cache=False)), (_ids(),)),
        "opt": lambda: (T.OPTModel(_config(T.OPTConfig, ffn_dim=256, word_embed_proj_dim=128,
                                           max_position_embeddings=64, num_hidden_layers=2, hidden_size=128,
                                           num_attention_heads=4, vocab_size=1000, use_cache=False)), (_ids(),)),
        "gpt_neox": lambda: (T.GPTNeoXModel(_config(T.GPTNeoXConfig, **decoder)), (_ids(),)),
        "bloom": lambda: (T.BloomModel(_config(T.BloomConfig, sdpa=False, n_layer=2, hidden_size=128, n_head=4,
                                               vocab_size=1000, use_cache=False)), (_ids(),)),
        "falcon": lambda: (T.FalconModel(_config(T.FalconConfig, num_hidden_layers=2, hidden_size=128,
                                                 num_attention_heads=4, vocab_size=1000, use_cache=False)),
                           (_ids(),)),
        "phi": lambda: (T.PhiModel(_config(T.PhiConfig, **decoder)), (_ids(),)),
        "qwen2": lambda: (T.Qwen2Model(_config(T.Qwen2Config, num_key_value_heads=2, **decoder)), (_ids(),)),
        "mistral": lambda: (T.MistralModel(_config(T.MistralConfig, num_key_value_heads=2, **decoder)), (_ids(),)),
        "gemma": lambda: (T.GemmaModel(_config(T.GemmaConfig, num_key_value_heads=1, head_dim=32, **decoder)),
                          (_ids(),)),
        "llama": lambda: (T.LlamaModel(_config(T.LlamaConfig, num_key_value_heads=2, **decoder)), (_ids(),)),
        "mamba": lambda: (T.MambaModel(_config(T.MambaConfig, sdpa=False, num_hidden_layers=2, hidden_size=64,
                                               state_size=8, vocab_size=1000, use_cache=False)), (_ids(),)),
        "vit": lambda: (T.ViTModel(_config(T.ViTConfig, **vision)), (_image(),)),
        "clip_vision": lambda: (T.CLIPVisionModel(_config(T.CLIPVisionConfig, **vision)), (_image(),)),
        "clip_text": lambda: (T.CLIPTextModel(_config(T.CLIPTextConfig, **text)), (_ids(),)),
        "swin": lambda: (T.SwinModel(_config(T.SwinConfig, image_size=64, patch_size=4, embed_dim=32, depths=[1, 1],
                                             num_heads=[2, 4], window_size=4)), (_image(),)),
        "dinov2": lambda: (T.Dinov2Model(_config(T.Dinov2Config, num_hidden_layers=2, hidden_size=128,
                                                 num_attention_heads=4, image_size=56, patch_size=14)),
                           (torch.randn(1, 3, 56, 56),)),
        "beit": lambda: (T.BeitModel(_config(T.BeitConfig, sdpa=False, use_relative_position_bias=True, **vision)),
                         (_image(),)),
        "levit": lambda: (T.LevitModel(_config(T.LevitConfig, sdpa=False, image_size=64, hidden_sizes=[32, 64, 96],
                                               num_attention_heads=[1, 2, 3], depths=[1, 1, 1], key_dim=[8, 8, 8])),
                          (_image(),)),
        "perceiver": lambda: (T.PerceiverModel(_config(T.PerceiverConfig, sdpa=False, num_latents=16, d_latents=64,
                                                       d_model=32, num_blocks=1, num_self_attends_per_block=1,
                                                       num_self_attention_heads=2, num_cross_attention_heads=1)),
                              (torch.randn(1, 20, 32),)),
        "convnext": lambda: (T.ConvNextModel(_config(T.ConvNextConfig, sdpa=False, hidden_sizes=[32, 64],
                                                     depths=[1, 1], num_stages=2)), (_image(),)),
        "segformer": lambda: (T.SegformerModel(_config(T.SegformerConfig, sdpa=False, num_encoder_blocks=2,
                                                       depths=[1, 1], hidden_sizes=[32, 64],
                                                       num_attention_heads=[1, 2], sr_ratios=[2, 1],
                                                       patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2])),
                              (_image(),)),
        "mobilevit": lambda: (T.MobileViTModel(_config(T.MobileViTConfig, sdpa=False, image_size=64)), (_image(),)),
        "detr": lambda: (T.DetrModel(_config(T.DetrConfig, sdpa=False, use_timm_backbone=False,
                                             backbone_config=T.ResNetConfig(depths=[1, 1], hidden_sizes=[32, 64],
                                                                            layer_type="basic",
                                                                            out_features=["stage2"]),
                                             encoder_layers=1, decoder_layers=1, d_model=64,
                                             encoder_attention_heads=4, decoder_attention_heads=4,
                                             encoder_ffn_dim=128, decoder_ffn_dim=128, num_queries=10)),
                         (_image(),)),
        "whisper_encoder": lambda: (T.WhisperModel(_config(T.WhisperConfig, encoder_layers=2, decoder_layers=1,
                                                           d_model=128, encoder_attention_heads=4,
                                                           decoder_attention_heads=4, encoder_ffn_dim=256,
                                                           decoder_ffn_dim=256, num_mel_bins=80,
                                                           max_source_positions=50, vocab_size=1000,
                                                           pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                                           decoder_start_token_id=1)).encoder,
                                    (torch.randn(1, 80, 100),)),
        "wav2vec2": lambda: (T.Wav2Vec2Model(_config(T.Wav2Vec2Config, num_hidden_layers=2, hidden_size=64,
                                                     num_attention_heads=4, intermediate_size=128, conv_dim=(32, 32),
                                                     conv_stride=(5, 2), conv_kernel=(10, 3),
                                                     num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)),
                             (torch.randn(1, 4000),)),
        "gptj": lambda: (T.GPTJModel(_config(T.GPTJConfig, n_layer=2, n_embd=128, n_head=4, rotary_dim=16,
                                             vocab_size=1000, n_positions=64, use_cache=False)), (_ids(),)),
        "codegen": lambda: (T.CodeGenModel(_config(T.CodeGenConfig, n_layer=2, n_embd=128, n_head=4, rotary_dim=16,
                                                   vocab_size=1000, n_positions=64, n_ctx=64, use_cache=False)),
                            (_ids(),)),
        "stablelm": lambda: (T.StableLmModel(_config(T.StableLmConfig, num_key_value_heads=4, **decoder)), (_ids(),)),
        "phi3": lambda: (T.Phi3Model(_config(T.Phi3Config, num_key_value_heads=2, pad_token_id=0, **decoder)),
                         (_ids(),)),
        "qwen3": lambda: (T.Qwen3Model(_config(T.Qwen3Config, num_key_value_heads=2, head_dim=32, **decoder)),
                          (_ids(),)),
        "gemma2": lambda: (T.Gemma2Model(_config(T.Gemma2Config, sdpa=False, num_key_value_heads=2, head_dim=32, sliding_window=8,
                                                 **decoder)), (_ids(),)),
        "olmo2": lambda: (T.Olmo2Model(_config(T.Olmo2Config, **decoder)), (_ids(),)),
        "mpt": lambda: (T.MptModel(_config(T.MptConfig, sdpa=False, n_layers=2, d_model=128, n_heads=4,
                                           expansion_ratio=2, vocab_size=1000, max_seq_len=64, use_cache=False)),
                        (_ids(),)),
        "gpt_bigcode": lambda: (T.GPTBigCodeModel(_config(T.GPTBigCodeConfig, n_layer=2, n_embd=128, n_head=4,
                                                          vocab_size=1000, n_positions=64, use_cache=False)),
                                (_ids(),)),
        "mixtral": lambda: (T.MixtralModel(_config(T.MixtralConfig, num_key_value_heads=2, num_local_experts=4,
                                                   num_experts_per_tok=2, **decoder)), (_ids(),)),
        # The experts as one gather of each token's expert weights and a bmm
        # (transformers' export-friendly experts_implementation) instead of
        # the default sort + histc + grouped_mm custom op.
        "mixtral_batched_mm": lambda: (T.MixtralModel(_config(T.MixtralConfig, num_key_value_heads=2,
                                                              num_local_experts=4, num_experts_per_tok=2,
                                                              experts_implementation="batched_mm", **decoder)),
                                       (_ids(),)),
        "mobilebert": lambda: (T.MobileBertModel(_config(T.MobileBertConfig, embedding_size=64, true_hidden_size=64,
                                                         intra_bottleneck_size=64, num_feedforward_networks=2,
                                                         **text)), (_ids(),)),
        "funnel": lambda: (T.FunnelModel(_config(T.FunnelConfig, sdpa=False, block_sizes=[1, 1], d_model=64, n_head=4,
                                                 d_head=16, d_inner=128, num_decoder_layers=1, vocab_size=1000)),
                           (_ids(),)),
        "xlnet": lambda: (T.XLNetModel(_config(T.XLNetConfig, sdpa=False, d_model=64, n_layer=2, n_head=4, d_inner=128,
                                               vocab_size=1000, use_mems_eval=False)), (_ids(),)),
        "resnet": lambda: (T.ResNetModel(_config(T.ResNetConfig, sdpa=False, embedding_size=32, hidden_sizes=[32, 64],
                                                 depths=[1, 1], layer_type="bottleneck")), (_image(),)),
        "regnet": lambda: (T.RegNetModel(_config(T.RegNetConfig, sdpa=False, embedding_size=32, hidden_sizes=[32, 64],
                                                 depths=[1, 1], groups_width=16)), (_image(),)),
        "efficientnet": lambda: (T.EfficientNetModel(_config(T.EfficientNetConfig, sdpa=False, image_size=64,
                                                             width_coefficient=0.25, depth_coefficient=0.25,
                                                             hidden_dim=320)), (_image(),)),
        "mobilenet_v2": lambda: (T.MobileNetV2Model(_config(T.MobileNetV2Config, sdpa=False, image_size=64,
                                                            depth_multiplier=0.35)), (_image(),)),
        "convnextv2": lambda: (T.ConvNextV2Model(_config(T.ConvNextV2Config, sdpa=False, hidden_sizes=[32, 64],
                                                         depths=[1, 1], num_stages=2)), (_image(),)),
        "poolformer": lambda: (T.PoolFormerModel(_config(T.PoolFormerConfig, sdpa=False, num_encoder_blocks=2,
                                                         depths=[1, 1], hidden_sizes=[32, 64], patch_sizes=[7, 3],
                                                         strides=[4, 2], padding=[2, 1])), (_image(),)),
        "yolos": lambda: (T.YolosModel(_config(T.YolosConfig, num_detection_tokens=10, **dict(vision, image_size=[64, 64]))),
                          (_image(),)),
        "dpt": lambda: (T.DPTModel(_config(T.DPTConfig, backbone_out_indices=[0, 1, 1, 1], **vision),
                                   add_pooling_layer=False), (_image(),)),
        "sam_vision": lambda: (T.SamVisionModel(_config(T.SamVisionConfig, sdpa=False, hidden_size=64,
                                                        num_hidden_layers=2, num_attention_heads=4, mlp_dim=128,
                                                        image_size=64, patch_size=8, output_channels=32,
                                                        window_size=4, global_attn_indexes=[1])), (_image(),)),
        "hubert": lambda: (T.HubertModel(_config(T.HubertConfig, num_hidden_layers=2, hidden_size=64,
                                                 num_attention_heads=4, intermediate_size=128, conv_dim=(32, 32),
                                                 conv_stride=(5, 2), conv_kernel=(10, 3),
                                                 num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)),
                           (torch.randn(1, 4000),)),
        "speech2text_encoder": lambda: (T.Speech2TextModel(_config(T.Speech2TextConfig, sdpa=False, encoder_layers=2,
                                                                   decoder_layers=1, d_model=128,
                                                                   encoder_attention_heads=4,
                                                                   decoder_attention_heads=4, encoder_ffn_dim=256,
                                                                   decoder_ffn_dim=256, vocab_size=1000,
                                                                   input_feat_per_channel=80,
                                                                   conv_channels=128)).encoder,
                                        (torch.randn(1, 100, 80),)),
        "ast": lambda: (T.ASTModel(_config(T.ASTConfig, num_hidden_layers=2, hidden_size=128, num_attention_heads=4,
                                           intermediate_size=256, patch_size=16, num_mel_bins=32, max_length=64,
                                           frequency_stride=10, time_stride=10)), (torch.randn(1, 64, 32),)),
    }


# The partitioner's line for each op it leaves to the CPU (logged on "kiln"),
# and the line for a node refused after its partition failed to compile
# (python/kiln/_partition_trial.py): the final summary line names no reason
# for those, so the first is kept.
_CPU_LINE = re.compile(r"^kiln: (\S+) x\d+ on the CPU: (.*)$")
_TRIAL_LINE = re.compile(r"^kiln: (\S+) \('[^']*'\) left to the CPU: (.*)$")


class _CpuReasons(logging.Handler):
    """Collects the reason the partitioner announces for each op left to the CPU."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.reasons: dict[str, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        match = _CPU_LINE.match(message) or _TRIAL_LINE.match(message)
        if match:
            self.reasons.setdefault(match.group(1), match.group(2))


def sweep_one(name: str, make, target_sms: tuple[int, ...]) -> dict:
    """Exports one model; returns its row: status, CPU ops and Kiln's reasons."""
    start = time.time()
    torch.manual_seed(0)
    logger = logging.getLogger("kiln")
    collected = _CpuReasons()
    level = logger.level
    logger.addHandler(collected)
    logger.setLevel(min(level, logging.INFO) if level else logging.INFO)
    try:
        model, inputs = make()
        wrapped = LastHidden(model.eval()).eval()
        try:
            with torch.no_grad():
                program = torch.export.export(wrapped, inputs, strict=False)
        except Exception as e:  # noqa: BLE001 - torch.export's own limits are findings, not Kiln's
            return {"model": name, "status": "export failed", "detail": f"{type(e).__name__}: {str(e)[:160]}",
                    "seconds": time.time() - start}
        try:
            compiled = kiln.compile(program, arg_inputs=inputs, min_block_size=1, target_sms=target_sms)
        except Exception as e:  # noqa: BLE001 - an abort inside Kiln: the one failure this sweep reports
            return {"model": name, "status": "abort", "detail": f"{type(e).__name__}: {str(e)[:300]}",
                    "seconds": time.time() - start}
        cpu = dict(compiled.summary.ops_on_cpu)
        return {"model": name, "status": "pass" if not cpu else "cpu", "cpu_ops": cpu,
                "reasons": {op: collected.reasons.get(op, "") for op in cpu}, "delegates": len(compiled.delegates),
                "seconds": time.time() - start}
    finally:
        logger.removeHandler(collected)
        logger.setLevel(level)


def markdown(rows: list[dict], commit: str) -> str:
    lines = [
        "# Coverage: small Hugging Face configs through Kiln",
        "",
        f"Written by `tools/coverage/hf_sweep.py` at commit {commit} (CPU export only: which ops stay on the",
        "CPU, and why; the numerics of the engines are the GPU suites' job). Random weights, 2 layers, batch 1.",
        "",
        "| model | status | engines | ops left to the CPU (Kiln's reason) | seconds |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        ops = "; ".join(f"`{op}` x{n}" + (f" ({r['reasons'][op]})" if r["reasons"].get(op) else "")
                        for op, n in r.get("cpu_ops", {}).items()) or r.get("detail", "")
        lines.append(f"| {r['model']} | {r['status']} | {r.get('delegates', '')} | {ops} | {r['seconds']:.1f} |")
    passed = sum(r["status"] == "pass" for r in rows)
    lines += ["", f"{passed}/{len(rows)} models with every op in Kiln engines; "
              f"{sum(r['status'] == 'abort' for r in rows)} aborted inside Kiln."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="", help="comma-separated subset (default: all)")
    parser.add_argument("--markdown", type=Path, help="write the table here")
    parser.add_argument("--target-sms", default="90", help="comma-separated SMs the engines target")
    args = parser.parse_args(argv)
    table = cases()
    names = [m for m in args.models.split(",") if m] or list(table)
    unknown = [m for m in names if m not in table]
    if unknown:
        parser.error(f"unknown models {unknown}; known: {', '.join(table)}")
    target_sms = tuple(int(s) for s in args.target_sms.split(","))
    rows = []
    for name in names:
        row = sweep_one(name, table[name], target_sms)
        rows.append(row)
        cpu = ", ".join(f"{op} x{n}" for op, n in row.get("cpu_ops", {}).items())
        print(f"hf_sweep: {name}: {row['status']}{': ' + cpu if cpu else ''}{': ' + row['detail'] if 'detail' in row else ''}"
              f" ({row['seconds']:.1f} s)", flush=True)
    if args.markdown:
        import subprocess
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip() or "unknown"
        args.markdown.write_text(markdown(rows, commit))
        print(f"hf_sweep: wrote {args.markdown}")
    return 1 if any(r["status"] == "abort" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
