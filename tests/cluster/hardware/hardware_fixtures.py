"""Paths to the real model configs and operator profiles the tests use: the copies bundled
with pdlab (cluster/data/files, `pdlab data list`)."""

from __future__ import annotations

from cluster.data import BUNDLED

LLAMA = BUNDLED / "models/meta-llama/Llama-3.1-8B.json"
QWEN32 = BUNDLED / "models/Qwen/Qwen3-32B.json"
QWEN_MOE = BUNDLED / "models/Qwen/Qwen3-30B-A3B-Instruct-2507.json"
P4090 = BUNDLED / "profiles/llmservingsim_rtx4090_llama31_8b"
P32 = BUNDLED / "profiles/llmservingsim_rtxpro6000_qwen3_32b"
PMOE = BUNDLED / "profiles/llmservingsim_rtxpro6000_qwen3_30b_a3b"
