"""Importers of serving runs recorded by other tools into the SPEC §3 tables (SPEC §9).

- `vllm_result`: vLLM's own `vllm bench serve --save-result` JSON (`run_files` finds the
  runs of a directory);
- `vllm_bench`: a vLLM run recorded by LLMServingSim's bench (meta.json + requests.jsonl);
- `sglang_bench`: SGLang `bench_serving --output-file --output-details` JSONL.
Both produce `bench_run.BenchRun`s that `bench_run.write_runs` inserts in one transaction;
malformed input raises `fields.ImportFileError` naming the file, line and field.
"""

from toolkit.importers.bench_run import BenchRun, write_runs
from toolkit.importers.fields import ImportFileError
from toolkit.importers.run_files import FoundRun, find_runs
from toolkit.importers.sglang_bench import read_sglang_bench, server_settings
from toolkit.importers.vllm_bench import read_vllm_bench
from toolkit.importers.vllm_result import read_vllm_result

__all__ = [
    "BenchRun",
    "FoundRun",
    "ImportFileError",
    "find_runs",
    "read_sglang_bench",
    "read_vllm_bench",
    "read_vllm_result",
    "server_settings",
    "write_runs",
]
