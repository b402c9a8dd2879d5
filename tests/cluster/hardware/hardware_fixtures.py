"""Paths to the bundled copies of real model configs and operator profiles (tests/fixtures)."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
LLAMA = FIXTURES / "models/meta-llama/Llama-3.1-8B.json"
QWEN32 = FIXTURES / "models/Qwen/Qwen3-32B.json"
QWEN_MOE = FIXTURES / "models/Qwen/Qwen3-30B-A3B-Instruct-2507.json"
P4090 = FIXTURES / "profiles/llmservingsim_rtx4090_llama31_8b"
P32 = FIXTURES / "profiles/llmservingsim_rtxpro6000_qwen3_32b"
PMOE = FIXTURES / "profiles/llmservingsim_rtxpro6000_qwen3_30b_a3b"
