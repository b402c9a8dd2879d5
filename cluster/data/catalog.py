"""The real data sets pdlab ships (`cluster/data/files/`), each with its source and license.

One entry per data set: its name (what `pdlab data path NAME` takes), its path under a data
root (the same layout as a full copy, e.g. the project's `../shared/data`), what it is, where
it comes from and under which license. `scripts/bundle_data.py` builds the bundled copy from
a full copy: these files, byte for byte, those over BUNDLE_GZIP_BYTES gzip-compressed
(`<name>.gz`; every reader takes the `.gz` for a missing plain file).
"""

from __future__ import annotations

from typing import NamedTuple

BUNDLE_GZIP_BYTES = 256 * 1024  # larger files are bundled as <name>.gz


class Dataset(NamedTuple):
    name: str
    path: str  # under a data root: a file or a folder
    what: str
    source: str
    license: str
    files: tuple[str, ...] = ()  # of a folder: the files bundled (all when empty)


_LSS = "casys-kaist/LLMServingSim@5daddb21"
_LSS_MIT = "MIT (LLMServingSim)"
_PROFILE_FILES = ("SOURCE.txt", "attention.csv", "dense.csv", "per_sequence.csv")
_NO_SKEW = "; skew tables left out (unused)"

DATASETS: tuple[Dataset, ...] = (
    Dataset(
        "sweagent",
        "traces/thunderagent_sweagent_glm45fp8_h200_turns.jsonl",
        "5,788 turns of 133 SWE-agent programs on vLLM (GLM-4.5-FP8, H200) at 1/4/32 agents",
        "ThunderAgent-org/ThunderAgent@908c6c87",
        "none stated upstream (public repository)",
    ),
    Dataset(
        "mooncake",
        "traces/mooncake_fast25_conversation_trace.jsonl",
        "12,031 requests of Mooncake's conversation trace with prefix block hashes",
        "kvcache-ai/Mooncake FAST25-release",
        "Apache-2.0 (Mooncake)",
    ),
    Dataset(
        "azure-conv",
        "traces/azure2023_splitwise_conv_via_vidur.csv",
        "Azure LLM inference trace 2023, conversation (arrivals, prompt and output tokens)",
        "Azure/AzurePublicDataset via microsoft/vidur data/processed_traces",
        "CC-BY-4.0 (Azure Public Dataset)",
    ),
    Dataset(
        "azure-code",
        "traces/azure2023_splitwise_code_via_vidur.csv",
        "Azure LLM inference trace 2023, code (arrivals, prompt and output tokens)",
        "Azure/AzurePublicDataset via microsoft/vidur data/processed_traces",
        "CC-BY-4.0 (Azure Public Dataset)",
    ),
    Dataset(
        "vllm-rtx4090-llama31-8b",
        "real_runs/rtx4090_llama31_8b_vllm",
        "a real vLLM 0.19 run: RTX 4090, Llama-3.1-8B TP1, 300 ShareGPT requests at ~10/s",
        f"{_LSS} bench/examples/RTX4090",
        _LSS_MIT,
    ),
    Dataset(
        "vllm-rtxpro6000-qwen3-32b",
        "real_runs/rtxpro6000_qwen3_32b_vllm",
        "a real vLLM 0.19 run: 2x RTX PRO 6000, Qwen3-32B TP2, 300 ShareGPT requests",
        f"{_LSS} bench/examples/RTXPRO6000",
        _LSS_MIT,
    ),
    Dataset(
        "profile-rtx4090-llama31-8b",
        "profiles/llmservingsim_rtx4090_llama31_8b",
        "operator timings (dense, per-sequence, attention) for `pdlab profile import`" + _NO_SKEW,
        f"{_LSS} profiler/perf/RTX4090",
        _LSS_MIT,
        _PROFILE_FILES,
    ),
    Dataset(
        "profile-rtxpro6000-qwen3-32b",
        "profiles/llmservingsim_rtxpro6000_qwen3_32b",
        "operator timings at TP1 and TP2 (`tp2/`) for `pdlab profile import`" + _NO_SKEW,
        f"{_LSS} profiler/perf/RTXPRO6000",
        _LSS_MIT,
        (*_PROFILE_FILES, *(f"tp2/{f}" for f in _PROFILE_FILES[1:])),
    ),
    Dataset(
        "profile-rtxpro6000-qwen3-30b-a3b",
        "profiles/llmservingsim_rtxpro6000_qwen3_30b_a3b",
        "operator timings with the MoE block (`moe.csv`) for `pdlab profile import`" + _NO_SKEW,
        f"{_LSS} profiler/perf/RTXPRO6000",
        _LSS_MIT,
        (*_PROFILE_FILES, "moe.csv"),
    ),
    Dataset(
        "vidur-a100",
        "profiles/vidur",
        "A100 attention and Llama-3-8B MLP operator times (toolkit.profiles.real 'a100')",
        "microsoft/vidur data/profiling (e2d00e9, 7d47513)",
        "MIT (vidur)",
        (
            "SOURCE.txt",
            "a100_attention_llama2-70b-shape_tp2_commit-e2d00e9.csv",
            "a100_Meta-Llama-3-8B_mlp.csv",
            "a100_cpu_overheads_commit-e2d00e9.csv",
        ),
    ),
    Dataset(
        "lss-h100",
        "profiles/llmservingsim_h100",
        "H100 Llama-3.1-70B TP4 layer and attention times (toolkit.profiles.real 'h100')",
        "casys-kaist/LLMServingSim@9e3f0ece llm_profile/perf_models/H100",
        _LSS_MIT,
        ("SOURCE.txt", "h100_llama31_70b_tp4_attention.csv", "h100_llama31_70b_tp4_layers.csv"),
    ),
    Dataset(
        "models",
        "models",
        "Hugging Face config.json of Llama-3.1-8B, Qwen3-32B, Qwen3-30B-A3B-Instruct-2507",
        f"{_LSS} configs/model",
        "the models' own: Llama 3.1 Community License, Apache-2.0 (Qwen3)",
    ),
    Dataset(
        "lss-a6000",
        "lss_ispass26_a6000",
        "LLMServingSim ISPASS'26 artifact, RTX A6000: requests, real throughput and prefix "
        "series of 6 setups (multi-instance, PD split, MoE, prefix caching), TP1 profiles",
        "casys-kaist/LLMServingSim ispass26-artifact@f4ab208c",
        _LSS_MIT + "; model configs: Llama 3.1 Community License, MIT (Phi-mini-MoE)",
        (
            "datasets/sharegpt_pulse_req50_n6_delay15_pc.jsonl",
            "datasets/sharegpt_req300_rate10_llama.jsonl",
            "datasets/sharegpt_req300_rate10_phi.jsonl",
            *(f"figure_5/{d}/{s}_{k}" for d, k in (("config", "config.json"),
                                                   ("llmservingsim", "throughput.tsv"),
                                                   ("reference", "throughput.tsv"))
              for s in ("MD", "PDD", "SD+PC", "SM")),
            "figure_7/config/MD+PC+PS_config.json",
            "figure_7/config/SD+PC_config.json",
            *(f"figure_7/reference/{n}.tsv"
              for n in ("MD+PC+PS_inst0", "MD+PC+PS_inst1", "MD+PC+PS_shared_cpu", "SD+PC")),
            "models/meta-llama/Llama-3.1-8B.json",
            "models/microsoft/Phi-mini-MoE-instruct.json",
            *(f"profiles/{m}/tp1/{f}" for m in ("meta-llama/Llama-3.1-8B",
                                                "microsoft/Phi-mini-MoE-instruct")
              for f in ("attention.csv", "layers.csv")),
        ),
    ),
)  # fmt: skip

BY_NAME = {d.name: d for d in DATASETS}
